# shellcheck shell=bash
# Shared by the job scripts in jobscripts/ (source it; do not run it). Bash only.
#
#   pt_log MSG...                    print "pipetrain-job: MSG" on stderr
#   pt_die MSG...                    same, then exit 1
#   pt_find_pipetrain                print the pipetrain executable: $PIPETRAIN, else
#                                    `pipetrain` on PATH (module loaded), else the
#                                    installed PREFIX/bin/pipetrain (for the copy in
#                                    PREFIX/share/pipetrain/jobscripts), else
#                                    build/bin/pipetrain of this checkout
#   pt_toml_get FILE SECTION KEY     a `key = value` of [SECTION] in a TOML file (quotes
#                                    and comments stripped); empty when absent
#   pt_config_get CONFIG SECTION.KEY DEFAULT [TRAIN ARGS...]
#                                    the value pipetrain will use: the last
#                                    `--set SECTION.KEY=V` in the args, else the file's,
#                                    else DEFAULT
#   pt_grid_ranks CONFIG [TRAIN ARGS...]
#                                    MPI ranks the run needs: parallel.dp * pp * cp * tp
#   pt_checkpoint_step DIR           step of the checkpoint DIR/latest names (the next
#                                    step to run), read with `pipetrain ckpt inspect`;
#                                    fails (prints nothing) when there is none
#   pt_decide DIR TARGET_STEPS SUBMISSION MAX_SUBMISSIONS
#                                    after a run that exited 0: prints one line
#                                    "done STEP" (STEP >= TARGET_STEPS),
#                                    "resubmit STEP" (more steps to go),
#                                    "limit STEP" (more to go but SUBMISSION >= MAX), or
#                                    "none" (no checkpoint: nothing to resume)
#   pt_run CMD...                    run CMD, or with PIPETRAIN_DRY_RUN=1 print
#                                    "dry run: CMD" instead
#   pt_train_setup CONFIG [USER TRAIN ARGS...]
#                                    sets train_args (array: --resume, checkpoint.dir
#                                    and .every overrides, then the user's options),
#                                    PT_CKPT_DIR and PT_TARGET_STEPS (what the run will
#                                    use) and PT_RANKS (dp * pp * cp * tp)
#   pt_check_grid CONFIG NRANKS WHERE
#                                    the run can start on NRANKS ranks: dp*pp*cp*tp = NRANKS
#                                    (any count under --plan auto), then `pipetrain check`
#                                    on one process (grid, lowered program, data, memory;
#                                    CHECK_ARGS adds options, e.g. --cluster F or --no-data);
#                                    WHERE names what set NRANKS, for the message
#   pt_directive_ranks SCRIPT        ranks a job script's own #SBATCH/#PBS lines ask for
#                                    (--ntasks, --nodes x --ntasks-per-node, select x mpiprocs)
#   pt_directive_nodes SCRIPT        nodes its #SBATCH --nodes asks for (1 without one)
#   pt_slurm_shape NRANKS NODES      the sbatch options that ask for NRANKS ranks on NODES
#                                    nodes: --nodes, --ntasks and --ntasks-per-node (which
#                                    overrides the script's own #SBATCH line; Slurm takes it as
#                                    the most per node when --ntasks is given too)
#   pt_after_run RC SUBMISSION MAX RESUBMIT_CMD...
#                                    after the launcher returned RC: on 0, pt_decide and
#                                    run RESUBMIT_CMD when more steps are left (with
#                                    PIPETRAIN_DRY_RUN=1 print "would resubmit: CMD");
#                                    returns the job script's exit status
#   pt_sbatch ARGS...                sbatch without this job's SLURM_* variables
#
# The TOML reader understands plain `key = value` lines under [section] headers, which
# is how every bundled config is written; inline tables and dotted keys are not read
# (pipetrain itself reads those fine, only these helpers would miss them).

pt_log() { printf 'pipetrain-job: %s\n' "$*" >&2; }
pt_die() {
  pt_log "error: $*"
  exit 1
}

pt_find_pipetrain() {
  if [ -n "${PIPETRAIN:-}" ]; then
    printf '%s\n' "$PIPETRAIN"
  elif command -v pipetrain >/dev/null 2>&1; then
    command -v pipetrain
  else
    local lib
    lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    if [ -x "$lib/../../../../bin/pipetrain" ]; then  # installed: PREFIX/share/pipetrain/jobscripts/lib
      (cd "$lib/../../../../bin" && printf '%s/pipetrain\n' "$(pwd)")
    else                                               # a checkout: jobscripts/lib
      (cd "$lib/../.." && printf '%s/build/bin/pipetrain\n' "$(pwd)")
    fi
  fi
}

pt_toml_get() {  # FILE SECTION KEY
  awk -v want_section="$2" -v want_key="$3" -v sq="'" '
    /^[[:space:]]*\[/ {
      s = $0
      sub(/^[[:space:]]*\[[[:space:]]*/, "", s)
      sub(/[[:space:]]*\].*$/, "", s)
      section = s
      next
    }
    section == want_section {
      line = $0
      sub(/^[[:space:]]+/, "", line)
      k = line
      sub(/[[:space:]]*=.*$/, "", k)
      if (k != want_key || line !~ /=/) next
      v = line
      sub(/^[^=]*=[[:space:]]*/, "", v)
      if (v ~ /^"/) {
        v = substr(v, 2)
        sub(/".*$/, "", v)
      } else if (substr(v, 1, 1) == sq) {
        v = substr(v, 2)
        v = substr(v, 1, index(v, sq) - 1)
      } else {
        sub(/[[:space:]]*#.*$/, "", v)
        sub(/[[:space:]]+$/, "", v)
      }
      print v
      exit
    }' "$1"
}

pt_config_get() {  # CONFIG SECTION.KEY DEFAULT [TRAIN ARGS...]
  local config=$1 key=$2 default=$3 value="" found=0 arg override prev=""
  shift 3
  for arg in "$@"; do
    override=""
    if [ "$prev" = "--set" ]; then
      override=$arg
    elif [[ $arg == --set=* ]]; then
      override=${arg#--set=}
    fi
    prev=$arg
    [ -n "$override" ] || continue
    if [ "${override%%=*}" = "$key" ]; then
      value=${override#*=}
      found=1
    fi
  done
  if [ "$found" -eq 1 ]; then
    value=${value#\"}
    value=${value%\"}
  elif [ -f "$config" ]; then
    value=$(pt_toml_get "$config" "${key%%.*}" "${key#*.}")
  fi
  printf '%s\n' "${value:-$default}"
}

pt_grid_ranks() {  # CONFIG [TRAIN ARGS...]
  local config=$1 dp pp tp cp
  shift
  dp=$(pt_config_get "$config" parallel.dp 1 "$@")
  pp=$(pt_config_get "$config" parallel.pp 1 "$@")
  tp=$(pt_config_get "$config" parallel.tp 1 "$@")
  cp=$(pt_config_get "$config" parallel.cp 1 "$@")
  [[ $dp =~ ^[0-9]+$ && $pp =~ ^[0-9]+$ && $tp =~ ^[0-9]+$ && $cp =~ ^[0-9]+$ ]] ||
    pt_die "$config: parallel.dp/pp/cp/tp are not plain integers ($dp, $pp, $cp, $tp)"
  echo $((dp * pp * cp * tp))
}

pt_checkpoint_step() {  # DIR
  local dir=$1 name path out step=""
  [ -f "$dir/latest" ] || return 1
  name=$(head -n 1 "$dir/latest" | tr -d '[:space:]')
  [ -n "$name" ] || return 1
  case $name in
    /*) path=$name ;;
    *) path=$dir/$name ;;
  esac
  if [ ! -f "$path" ]; then
    pt_log "warning: $dir/latest names $name, which does not exist"
    return 1
  fi
  PIPETRAIN=${PIPETRAIN:-$(pt_find_pipetrain)}
  # `ckpt inspect` prints "step N, tokens seen ...". It starts MPI as a singleton; if that
  # fails on this node, the file name (step_<N>.h5, N = the next step) says the same.
  if out=$(timeout 120 "$PIPETRAIN" ckpt inspect "$path" 2>&1); then
    step=$(printf '%s\n' "$out" | sed -n 's/^step \([0-9][0-9]*\),.*/\1/p' | head -n 1)
  fi
  if [ -z "$step" ]; then
    pt_log "warning: could not read the step with 'pipetrain ckpt inspect $path'; using the file name"
    if [[ $(basename "$path") =~ ^step_0*([0-9]+)\.h5$ ]]; then
      step=${BASH_REMATCH[1]}
    else
      return 1
    fi
  fi
  printf '%s\n' "$step"
}

pt_decide() {  # DIR TARGET_STEPS SUBMISSION MAX_SUBMISSIONS
  local dir=$1 target=$2 submission=$3 max=$4 step
  [[ $target =~ ^[0-9]+$ ]] || pt_die "train.steps is '$target', not an integer"
  [[ $submission =~ ^[0-9]+$ && $max =~ ^[0-9]+$ ]] ||
    pt_die "PIPETRAIN_SUBMISSION ($submission) and MAX_SUBMISSIONS ($max) must be integers"
  if ! step=$(pt_checkpoint_step "$dir"); then
    echo "none"
  elif [ "$step" -ge "$target" ]; then
    echo "done $step"
  elif [ -e "$dir/STOP" ]; then
    echo "stop $step"
  elif [ "$submission" -ge "$max" ]; then
    echo "limit $step"
  else
    echo "resubmit $step"
  fi
}

# shellcheck disable=SC2034  # train_args and PT_* are this function's results
pt_train_setup() {  # CONFIG [USER TRAIN ARGS...]
  local config=$1 every
  shift
  [ -f "$config" ] || pt_die "config $config not found (set CONFIG; relative paths are relative to $(pwd))"
  train_args=()
  if [ -n "${RESUME-auto}" ]; then
    train_args+=(--resume "${RESUME-auto}")
  fi
  if [ -n "${CKPT_DIR:-}" ]; then
    train_args+=(--set "checkpoint.dir=$CKPT_DIR")
  fi
  PT_TARGET_STEPS=$(pt_config_get "$config" train.steps 100 "${train_args[@]}" "$@")
  if [ -n "${CKPT_EVERY:-}" ]; then
    train_args+=(--set "checkpoint.every=$CKPT_EVERY")
  else
    every=$(pt_config_get "$config" checkpoint.every 0 "${train_args[@]}" "$@")
    # checkpoint.every = 0 writes no checkpoint when the run ends normally, and then the
    # resubmission logic could not tell a finished run from a stopped one: ask for one
    # checkpoint after the last step (every = steps).
    if [ "$every" = 0 ] && [ "$PT_TARGET_STEPS" -gt 0 ]; then
      train_args+=(--set "checkpoint.every=$PT_TARGET_STEPS")
    fi
  fi
  train_args+=("$@")
  PT_CKPT_DIR=$(pt_config_get "$config" checkpoint.dir checkpoints "${train_args[@]}")
  PT_TARGET_STEPS=$(pt_config_get "$config" train.steps 100 "${train_args[@]}")
  PT_RANKS=$(pt_grid_ranks "$config" "${train_args[@]}")
  PT_PLAN_AUTO=0
  local prev="" arg
  for arg in "${train_args[@]}"; do
    if [[ $arg == --plan=auto || ($prev == --plan && $arg == auto) ]]; then PT_PLAN_AUTO=1; fi
    prev=$arg
  done
  if [ "$(pt_config_get "$config" checkpoint.every 0 "${train_args[@]}")" = 0 ]; then
    pt_log "warning: checkpoint.every = 0: a finished run leaves no final checkpoint, so it may be resubmitted needlessly"
  fi
}

pt_check_grid() {  # CONFIG NRANKS WHERE
  local config=$1 nranks=$2 where=$3 out
  local -a extra=()
  read -r -a extra <<<"${CHECK_ARGS:-}"
  local per_node=${SLURM_NTASKS_PER_NODE:-}
  per_node=${per_node%%(*}  # "32" or "32(x2)"
  if [[ $per_node =~ ^[0-9]+$ ]]; then extra+=(--ranks-per-node "$per_node"); fi
  if [ "$PT_PLAN_AUTO" = 0 ] && [ "$nranks" != "$PT_RANKS" ]; then
    pt_die "$config needs parallel.dp*pp*cp*tp = $PT_RANKS ranks but the job runs $nranks ($where)"
  fi
  PIPETRAIN=${PIPETRAIN:-$(pt_find_pipetrain)}
  if [ ! -x "$PIPETRAIN" ]; then
    if [ "${PIPETRAIN_DRY_RUN:-0}" = 1 ]; then
      pt_log "dry run: no executable $PIPETRAIN to run 'pipetrain check' with"
      return 0
    fi
    pt_die "pipetrain executable $PIPETRAIN not found (set PIPETRAIN)"
  fi
  if [ "$PT_PLAN_AUTO" = 1 ] && [[ " ${train_args[*]} ${extra[*]} " != *" --cluster"* ]]; then
    pt_log "--plan auto without --cluster: the layout for $nranks ranks is chosen when the run starts"
    return 0
  fi
  if ! out=$(timeout 300 "$PIPETRAIN" check "$config" --ranks "$nranks" "${train_args[@]}" "${extra[@]}" 2>&1); then
    printf '%s\n' "$out" >&2
    pt_die "'pipetrain check' refused $config on $nranks ranks (above); nothing was started"
  fi
  pt_log "${out##*$'\n'}"
}

pt_directive_ranks() {  # SCRIPT
  awk '
    /^#SBATCH/ {
      for (i = 2; i <= NF; i++) {
        if ($i ~ /^--ntasks=/) { split($i, a, "="); tasks = a[2] }
        if ($i ~ /^--nodes=/) { split($i, a, "="); nodes = a[2] }
        if ($i ~ /^--ntasks-per-node=/) { split($i, a, "="); per = a[2] }
      }
    }
    /^#PBS[[:space:]]+-l[[:space:]]+select=/ {
      if (match($0, /select=[0-9]+/)) nodes = substr($0, RSTART + 7, RLENGTH - 7)
      if (match($0, /mpiprocs=[0-9]+/)) per = substr($0, RSTART + 9, RLENGTH - 9)
    }
    END {
      if (tasks) print tasks
      else if (per) print (nodes ? nodes : 1) * per
      else print 1
    }' "$1"
}

pt_directive_nodes() {  # SCRIPT
  awk '/^#SBATCH/ { for (i = 2; i <= NF; i++) if ($i ~ /^--nodes=/) { split($i, a, "="); nodes = a[2] } }
       END { print nodes ? nodes : 1 }' "$1"
}

pt_slurm_shape() {  # NRANKS NODES
  local nranks=$1 nodes=$2
  [[ $nranks =~ ^[1-9][0-9]*$ && $nodes =~ ^[1-9][0-9]*$ ]] || pt_die "ranks ($nranks) and nodes ($nodes) must be counts"
  [ "$nranks" -ge "$nodes" ] || pt_die "$nranks ranks cannot fill $nodes nodes (set NODES, or NRANKS)"
  printf '%s\n' --nodes="$nodes" --ntasks="$nranks" --ntasks-per-node=$(((nranks + nodes - 1) / nodes))
}

pt_after_run() {  # RC SUBMISSION MAX RESUBMIT_CMD...
  local rc=$1 submission=$2 max=$3 decision step out
  shift 3
  if [ "$rc" -ne 0 ]; then
    pt_log "the run failed (exit $rc): not resubmitting; fix the cause and submit again" \
      "(--resume auto continues from the newest checkpoint in $PT_CKPT_DIR that verifies)"
    return "$rc"
  fi
  out=$(pt_decide "$PT_CKPT_DIR" "$PT_TARGET_STEPS" "$submission" "$max") || return 1
  read -r decision step <<<"$out"
  case $decision in
    done)
      pt_log "done: the checkpoint in $PT_CKPT_DIR is at step $step of $PT_TARGET_STEPS"
      ;;
    none)
      pt_log "done: no checkpoint in $PT_CKPT_DIR (nothing to resume); not resubmitting"
      ;;
    stop)
      pt_log "stopped at step $step of $PT_TARGET_STEPS: $PT_CKPT_DIR/STOP exists; not resubmitting"
      ;;
    limit)
      pt_log "not done (step $step of $PT_TARGET_STEPS) but this is submission $submission of" \
        "MAX_SUBMISSIONS=$max: not resubmitting"
      return 1
      ;;
    resubmit)
      if [ "${PIPETRAIN_DRY_RUN:-0}" = 1 ]; then
        local shown=("$@")
        [ "${shown[0]}" != pt_sbatch ] || shown[0]=sbatch
        pt_log "would resubmit (step $step of $PT_TARGET_STEPS; submission $((submission + 1)) of $max): ${shown[*]}"
      else
        pt_log "step $step of $PT_TARGET_STEPS: resubmitting (submission $((submission + 1)) of $max)"
        "$@" || pt_die "resubmission failed:$(printf ' %q' "$@")"
      fi
      ;;
  esac
  return 0
}

pt_sbatch() {
  # This job's SLURM_* variables (task counts, memory, ...) would leak into the next
  # job through sbatch's default --export=ALL; keep only the site's SLURM_CONF.
  local -a drop=()
  local v
  for v in $(compgen -e); do
    if [[ $v == SLURM_* && $v != SLURM_CONF ]]; then
      drop+=(-u "$v")
    fi
  done
  env "${drop[@]}" sbatch "$@"
}

pt_run() {
  if [ "${PIPETRAIN_DRY_RUN:-0}" = 1 ]; then
    printf 'dry run:'
    printf ' %q' "$@"
    printf '\n'
  else
    "$@"
  fi
}
