#!/usr/bin/env bash
# The job scripts in jobscripts/: every one passes `bash -n`; every `pipetrain SUB --option`
# they use (on a pipetrain command line or in a train_args array) is an option of that
# subcommand's --help; the Slurm scripts signal the ranks (--signal=USR1@, not B:) and
# append to their log across a requeue (--open-mode=append).
# Then real runs without a batch system:
#   - workstation.sh trains a tiny model on 2 ranks (pp = 2) and checkpoints;
#   - the resubmission decision (PIPETRAIN_DRY_RUN=1) of both Slurm scripts and the PBS
#     script: "done" at the target step, "would resubmit" below it, the MAX_SUBMISSIONS
#     limit, and the STOP file; the single-node script as shipped (its #SBATCH ranks, the
#     default config); a multi-node resubmission asks for the job's ranks per node;
#   - slurm-multi-node.sbatch run directly with NRANKS: it submits the ranks it checked;
#   - slurm-single-node.sbatch with a stand-in `srun` (runs $MPIEXEC and sends SIGUSR1
#     after two steps, as --signal=USR1@300 would) and a stand-in `sbatch`: the run
#     checkpoints, exits 0 and resubmits; the "resubmitted" job resumes and finishes;
#   - pbs.qsub with WALLTIME set: its timer sends SIGUSR1, the run checkpoints and
#     resubmits through a stand-in `qsub`.
# Env: PIPETRAIN = the executable; SRC = the source tree; MPIEXEC = mpiexec.
set -euo pipefail
: "${PIPETRAIN:?set PIPETRAIN to the pipetrain executable}"
SRC=${SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
MPIEXEC=${MPIEXEC:-mpiexec}
export PIPETRAIN MPIEXEC
# CTest sets these for Open MPI; harmless for other MPIs.
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
die() { echo "FAIL: $*" >&2; exit 1; }
jobdir=$SRC/jobscripts

echo "== bash -n"
mapfile -t scripts < <(find "$jobdir" -type f | sort)
[ ${#scripts[@]} -ge 5 ] || die "expected the job scripts in $jobdir, found: ${scripts[*]}"
for f in "${scripts[@]}"; do
  bash -n "$f" || die "$f: syntax error"
  head -n 1 "$f" | grep -q '^#!' || [[ $f == */lib/* ]] || die "$f: no #! line"
done
for f in slurm-single-node.sbatch slurm-multi-node.sbatch pbs.qsub workstation.sh; do
  [ -f "$jobdir/$f" ] || die "missing jobscripts/$f"
done

echo "== pipetrain subcommands and options used by the scripts"
subcommands=$(timeout 60 "$PIPETRAIN" --help | awk '/^Subcommands:/ {on = 1; next} on && NF {print $1}')
[ -n "$subcommands" ] || die "no subcommands in '$PIPETRAIN --help'"
help_of() {  # SUB [SUBSUB] -> the help text (cached)
  local key=${*// /_}
  if [ ! -f "$tmp/help.$key" ]; then
    timeout 60 "$PIPETRAIN" "$@" --help >"$tmp/help.$key" 2>&1 || die "'pipetrain $* --help' failed"
  fi
  cat "$tmp/help.$key"
}
check_options() {  # FILE WHAT TEXT SUB [SUBSUB]
  local file=$1 what=$2 text=$3 opt
  shift 3
  text=${text%%#*}  # a trailing comment is not part of the command
  for opt in $(grep -oE -- '(^|[[:space:]("])--[A-Za-z][A-Za-z0-9-]*' <<<"$text" | grep -oE -- '--[A-Za-z0-9-]+' || true); do
    grep -qE -- "(^|[ ,])$opt([ =,]|$)" <<<"$(help_of "$@")" ||
      die "$file: '$what' uses 'pipetrain $* $opt', which '$PIPETRAIN $* --help' does not list"
    echo "   $(basename "$file"): pipetrain $* $opt"
  done
}
checked=0
invocation='(\$\{?PIPETRAIN\}?"?|[[:space:]/]pipetrain)[[:space:]]+([a-z][a-z-]*)(.*)$'
for f in "${scripts[@]}"; do
  # Join continuation lines, then look at each pipetrain command line (words after
  # "pipetrain" that are not subcommands are prose or messages and are skipped).
  while IFS= read -r line; do
    if [[ $line =~ $invocation ]] && grep -qx -- "${BASH_REMATCH[2]}" <<<"$subcommands"; then
      sub=${BASH_REMATCH[2]}
      rest=${BASH_REMATCH[3]}
      words=("$sub")
      if [[ $rest =~ ^[[:space:]]+([a-z][a-z-]*) ]] &&
         awk -v word="${BASH_REMATCH[1]}" '/^Subcommands:/ {on = 1; next} on && NF && $1 == word {found = 1} END {exit !found}' \
           <<<"$(help_of "$sub")"; then
        words+=("${BASH_REMATCH[1]}")
      fi
      check_options "$f" "$line" "$rest" "${words[@]}"
      checked=$((checked + 1))
    elif [[ $line =~ train_args\+?=\((.*)\) ]]; then
      check_options "$f" "$line" "${BASH_REMATCH[1]}" train
      checked=$((checked + 1))
    fi
  done < <(sed -e ':a' -e '/\\$/{N;s/\\\n//;ba' -e '}' "$f")
done
[ "$checked" -ge 6 ] || die "found only $checked pipetrain command lines in the job scripts"

echo "== Slurm signal directives"
for f in "$jobdir"/*.sbatch; do
  grep -qE '^#SBATCH[[:space:]]+--signal=USR1@[0-9]+' "$f" || die "$f: no '#SBATCH --signal=USR1@<seconds>'"
  ! grep -qE '^#SBATCH[[:space:]]+--signal=B:' "$f" || die "$f: --signal=B: would signal only the batch shell"
  grep -q -- '--resume' "$jobdir/lib/pipetrain_job.sh" || die "lib: no --resume"
  grep -qE '^[^#]*srun ' "$f" || die "$f: does not launch with srun"
  # A requeue restarts the script with the same output file: append, never truncate.
  grep -qE '^#SBATCH[[:space:]]+--open-mode=append' "$f" || die "$f: no '#SBATCH --open-mode=append'"
done

cd "$tmp"
head -c 150000 "$SRC/inputs/austen.txt" >corpus.txt
timeout 120 "$PIPETRAIN" data text corpus.txt -o corpus.h5 >/dev/null
config=$SRC/inputs/austen-char.toml
tiny=(--set data.train=corpus.h5 --set model.n_layer=2 --set model.d_model=64 --set train.seq_len=32
      --set model.max_seq_len=32 --set train.global_batch=8 --set train.microbatches=2 --set log.every=1)

echo "== workstation.sh: 2 ranks, pp = 2, 4 steps, checkpoints every 2"
timeout 300 "$jobdir/workstation.sh" "$config" 2 --set parallel.pp=2 "${tiny[@]}" --set train.steps=4 \
  --set checkpoint.dir=ws --set checkpoint.every=2 --metrics ws.jsonl >ws.out 2>&1 || { cat ws.out; die "workstation.sh failed"; }
grep -q "done: 4 steps" ws.out || { cat ws.out; die "workstation.sh: no 'done: 4 steps'"; }
grep -qx step_00000004.h5 ws/latest || die "workstation.sh: ws/latest is not step_00000004.h5"
[ "$(grep -c . ws.jsonl)" -eq 4 ] || die "workstation.sh: expected 4 metrics rows"
# NRANKS from the config: pp = 2 without a rank count; RESUME=auto continues.
RESUME=auto timeout 300 "$jobdir/workstation.sh" "$config" --set parallel.pp=2 "${tiny[@]}" --set train.steps=6 \
  --set checkpoint.dir=ws --set checkpoint.every=2 >ws2.out 2>&1 || { cat ws2.out; die "workstation.sh RESUME=auto failed"; }
grep -q "resumed from ws/step_00000004.h5 at step 4" ws2.out || { cat ws2.out; die "workstation.sh did not resume"; }
grep -q "(2 ranks)" ws2.out || { cat ws2.out; die "workstation.sh: NRANKS not taken from the config"; }

echo "== resubmission decisions (PIPETRAIN_DRY_RUN=1), checkpoint ws/ at step 6"
decide() {  # STATUS EXPECTED SCRIPT [VAR=VALUE...] -- [ARGS...]
  local status=$1 expected=$2 script=$3 out rc=0
  shift 3
  local -a vars=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  out=$(env PIPETRAIN_DRY_RUN=1 CONFIG="$config" CKPT_DIR=ws CHECK_ARGS=--no-data "${vars[@]}" \
        timeout 120 bash "$jobdir/$script" "$@" 2>&1) || rc=$?
  [ "$rc" -eq "$status" ] || { echo "$out"; die "$script ${vars[*]} $*: exit status $rc, expected $status"; }
  grep -qF -- "$expected" <<<"$out" || { echo "$out"; die "$script ${vars[*]} $*: expected '$expected'"; }
  echo "   $script ${vars[*]} $*: $expected"
}
for s in slurm-single-node.sbatch slurm-multi-node.sbatch; do
  decide 0 "done: the checkpoint in ws is at step 6 of 6" "$s" -- --set parallel.pp=2 --set train.steps=6
  decide 0 "would resubmit (step 6 of 9; submission 2 of 20): sbatch --dependency=afterany:" "$s" \
    -- --set parallel.pp=2 --set train.steps=9
  decide 0 "PIPETRAIN_SUBMISSION=2" "$s" -- --set parallel.pp=2 --set train.steps=9
  decide 0 "dry run: srun --ntasks=2" "$s" TRAIN_ARGS="--set parallel.pp=2 --set train.steps=9" --
  decide 1 "but this is submission 5 of MAX_SUBMISSIONS=5: not resubmitting" "$s" \
    PIPETRAIN_SUBMISSION=5 MAX_SUBMISSIONS=5 -- --set parallel.pp=2 --set train.steps=9
  decide 1 "needs parallel.dp*pp*cp*tp = 2 ranks but the job runs 4" "$s" SLURM_NTASKS=4 -- --set parallel.pp=2
done
decide 0 "done: the checkpoint in ws is at step 6" pbs.qsub TRAIN_ARGS="--set parallel.pp=2 --set train.steps=6" --
decide 0 "would resubmit (step 6 of 7; submission 4 of 20): qsub -V -v PIPETRAIN_SUBMISSION=4 -W depend=afterany:" \
  pbs.qsub PIPETRAIN_SUBMISSION=3 TRAIN_ARGS="--set parallel.pp=2 --set train.steps=7" --
decide 0 "dry run: $MPIEXEC -n 2" pbs.qsub TRAIN_ARGS="--set parallel.pp=2" --
# As shipped: `sbatch` with the script's own #SBATCH ranks and the default config runs.
shipped_ranks=$(sed -nE 's/^#SBATCH[[:space:]]+--ntasks=([0-9]+).*/\1/p' "$jobdir/slurm-single-node.sbatch")
decide 0 "dry run: srun --ntasks=1" slurm-single-node.sbatch SLURM_JOB_ID=7 SLURM_NTASKS="$shipped_ranks" \
  CONFIG="$SRC/inputs/austen-char.toml" --
# A resubmission asks for this job's ranks per node, overriding the #SBATCH line's 32.
decide 0 "--nodes=2 --ntasks=2 --ntasks-per-node=1 " slurm-multi-node.sbatch SLURM_JOB_NUM_NODES=2 SLURM_NTASKS=2 \
  -- --set parallel.pp=2 --set train.steps=9
touch ws/STOP
decide 0 "STOP exists; not resubmitting" slurm-single-node.sbatch -- --set parallel.pp=2 --set train.steps=9
rm ws/STOP
# checkpoint.every = 0 in the config: one checkpoint after the last step is asked for.
decide 0 "checkpoint.every=300" slurm-single-node.sbatch CKPT_DIR=none --
decide 0 "done: no checkpoint in none" slurm-single-node.sbatch CKPT_DIR=none --

echo "== slurm-single-node.sbatch with stand-in srun (SIGUSR1 after 2 steps) and sbatch"
mkdir bin
cat >bin/srun <<'EOF'
#!/usr/bin/env bash
# Stand-in srun: starts the command on --ntasks ranks with $MPIEXEC, and once two
# metrics rows exist sends SIGUSR1 to the launcher, as Slurm's --signal=USR1@T would.
set -euo pipefail
n=1
while [[ ${1:-} == -* ]]; do
  case $1 in --ntasks=*) n=${1#--ntasks=} ;; esac
  shift
done
"$MPIEXEC" -np "$n" "$@" &
pid=$!
for _ in $(seq 1200); do
  rows=$(grep -c . "$SIGNAL_AFTER_METRICS" 2>/dev/null || true)
  if [ "${rows:-0}" -ge 2 ]; then break; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
kill -USR1 "$pid" 2>/dev/null || true
wait "$pid"
EOF
cat >bin/sbatch <<'EOF'
#!/usr/bin/env bash
printf '%s\n' "$*" >>"$SUBMIT_LOG"
echo "Submitted batch job 1002"
EOF
cp bin/sbatch bin/qsub
chmod +x bin/*
export SUBMIT_LOG=$tmp/submitted.txt SIGNAL_AFTER_METRICS=$tmp/slurm.jsonl
: >"$SUBMIT_LOG"
PATH=$tmp/bin:$PATH CONFIG=$config CKPT_DIR=slurm SLURM_JOB_ID=1001 SLURM_NTASKS=2 \
  timeout 300 bash "$jobdir/slurm-single-node.sbatch" --set parallel.pp=2 "${tiny[@]}" \
  --set train.steps=100000 --metrics slurm.jsonl >slurm.out 2>&1 || { cat slurm.out; die "slurm job failed"; }
grep -q "stopping after step" slurm.out || { cat slurm.out; die "slurm job: pipetrain did not stop on SIGUSR1"; }
grep -q "resubmitting (submission 2 of 20)" slurm.out || { cat slurm.out; die "slurm job: no resubmission"; }
grep -q -- "--dependency=afterany:1001 --export=ALL,PIPETRAIN_SUBMISSION=2 .*slurm-single-node.sbatch --set parallel.pp=2" \
  "$SUBMIT_LOG" || { cat "$SUBMIT_LOG"; die "slurm job: sbatch arguments"; }
stopped=$(grep -c . slurm.jsonl)
echo "   stopped after $stopped steps and resubmitted: sbatch $(cat "$SUBMIT_LOG")"
# The resubmitted job: resumes from the checkpoint, finishes 2 more steps, is done.
: >"$SUBMIT_LOG"
PATH=$tmp/bin:$PATH CONFIG=$config CKPT_DIR=slurm SLURM_JOB_ID=1002 SLURM_NTASKS=2 PIPETRAIN_SUBMISSION=2 \
  SIGNAL_AFTER_METRICS=/nonexistent timeout 300 bash "$jobdir/slurm-single-node.sbatch" --set parallel.pp=2 \
  "${tiny[@]}" --set train.steps=$((stopped + 2)) --metrics slurm.jsonl >slurm2.out 2>&1 ||
  { cat slurm2.out; die "resubmitted slurm job failed"; }
grep -q "resumed from slurm/step_0*$stopped.h5 at step $stopped" slurm2.out || { cat slurm2.out; die "no resume"; }
grep -q "done: the checkpoint in slurm is at step $((stopped + 2)) of $((stopped + 2))" slurm2.out ||
  { cat slurm2.out; die "resubmitted job not done"; }
[ ! -s "$SUBMIT_LOG" ] || die "a finished job resubmitted: $(cat "$SUBMIT_LOG")"

echo "== slurm-multi-node.sbatch run directly with NRANKS=2: submits the 2 ranks it checked"
: >"$SUBMIT_LOG"
PATH=$tmp/bin:$PATH CONFIG=$config NRANKS=2 CHECK_ARGS=--no-data timeout 120 \
  bash "$jobdir/slurm-multi-node.sbatch" --set parallel.pp=2 >direct.out 2>&1 || { cat direct.out; die "run directly failed"; }
grep -q -- "^--nodes=2 --ntasks=2 --ntasks-per-node=1 .*slurm-multi-node.sbatch --set parallel.pp=2" "$SUBMIT_LOG" ||
  { cat direct.out "$SUBMIT_LOG"; die "multi-node, NRANKS=2: submitted another shape"; }
echo "   sbatch $(cat "$SUBMIT_LOG")"

echo "== pbs.qsub: the walltime timer sends SIGUSR1, the job checkpoints and resubmits"
: >"$SUBMIT_LOG"
PATH=$tmp/bin:$PATH CONFIG=$config CKPT_DIR=pbs PBS_JOBID=77.pbs PBS_O_WORKDIR=$tmp WALLTIME=12 STOP_MARGIN=2 \
  TRAIN_ARGS="--set parallel.pp=2 ${tiny[*]} --set train.steps=1000000" \
  timeout 300 bash "$jobdir/pbs.qsub" >pbs.out 2>&1 || { cat pbs.out; die "pbs job failed"; }
grep -q "SIGUSR1 to $MPIEXEC" pbs.out || { cat pbs.out; die "pbs job: the timer did not fire"; }
grep -q "stopping after step" pbs.out || { cat pbs.out; die "pbs job: pipetrain did not stop"; }
grep -q -- "-V -v PIPETRAIN_SUBMISSION=2 -W depend=afterany:77.pbs .*pbs.qsub" "$SUBMIT_LOG" ||
  { cat pbs.out "$SUBMIT_LOG"; die "pbs job: qsub arguments"; }
echo "   stopped at $(cat pbs/latest) and resubmitted: qsub $(cat "$SUBMIT_LOG")"
echo "all job script checks passed"
