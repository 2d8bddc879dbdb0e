#!/usr/bin/env python3
"""Every example command printed in the shipped files runs or validates as written.

Sources: the comment lines of inputs/*.toml and jobscripts/*, and the fenced code blocks
of README.md and docs/*.md. Each command is run in a scratch folder that holds the
source tree's inputs/ and jobscripts/ and a build/bin/pipetrain (bare `pipetrain` is on
PATH), with data/ empty until an example's `pipetrain data text` fills it:
  - pipetrain data text (its inputs are shipped), schedule, check, plan (not --calibrate),
    --version, --help: run as written; they must exit 0;
  - pipetrain train CONFIG ... under a launcher's N ranks (mpirun/mpiexec/srun -n N): the
    same arguments through `pipetrain check --ranks N --no-data` (the config, the grid for
    N ranks, the lowered program, the memory on inputs/clusters/cpu-node.toml, or
    dgx-h100.toml for a CUDA config, unless the example names a --cluster);
  - job scripts, run directly (stand-in sbatch/qsub record the submission: the script's
    own `pipetrain check` must pass first), through sbatch/qsub (run as the job with
    PIPETRAIN_DRY_RUN=1), or workstation.sh (PIPETRAIN_DRY_RUN=1): the launch command the
    script prints goes through `pipetrain check` as above;
  - ckpt, generate, report, data llmc and plan --calibrate, whose input files are the
    user's: every option must be one that subcommand's --help lists;
  - anything else (module, cmake, ctest, ./scripts/...) is not a pipetrain command and is
    listed as such.
Usage: examples_check.py PIPETRAIN SRC
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

PT, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
COMMAND_START = re.compile(r"(?:^|:\s+)((?:[A-Z_]+=(?:\"[^\"]*\"|\S+)\s+)*(?:build/bin/pipetrain|pipetrain|mpirun|mpiexec|srun|sbatch"
                           r"|qsub|jobscripts/)\S*(?:\s.*)?)$")
LAUNCHERS = {"mpirun", "mpiexec", "srun"}
failures, counts = [], {}


def fail(where, cmd, why):
    failures.append(f"{where}: {cmd}\n    {why}")


def examples():
    """(where, command text) for every example, continuation lines joined. In comments an
    example is indented (`#   cmd`) or follows a colon and two spaces; in the docs every
    line of a fenced block but ```text/toml/cmake ones (output, files) is a candidate."""
    out = []
    for path in sorted(glob.glob(f"{SRC}/inputs/*.toml") + glob.glob(f"{SRC}/jobscripts/*")):
        if os.path.isdir(path):
            continue
        lines = [l.rstrip("\n")[1:] for l in open(path, encoding="utf-8") if l.startswith("#") and not l.startswith("#!")]
        out += joined(os.path.relpath(path, SRC), lines, comment=True)
    for path in [f"{SRC}/README.md"] + sorted(glob.glob(f"{SRC}/docs/*.md")):
        block, fence = [], None
        for l in open(path, encoding="utf-8"):
            if l.startswith("```"):
                if fence is not None and fence in ("", "sh", "bash", "console"):
                    out += joined(os.path.relpath(path, SRC), block, comment=False)
                block, fence = [], (l[3:].strip() if fence is None else None)
            elif fence is not None:
                block.append(l.rstrip("\n"))
    return out


def joined(where, lines, comment):
    out, pending = [], ""
    for line in lines:
        text = pending + " " + line.strip() if pending else line
        if text.rstrip().endswith("\\"):
            pending = text.rstrip()[:-1].rstrip()
            continue
        pending = ""
        if comment:
            m = re.match(r"^\s{2,}(\S.*)$", text) or re.search(r":\s{2,}(\S.*)$", text)
            if m and COMMAND_START.match(m.group(1)):
                out.append((where, m.group(1)))
        elif text.strip() and not text.strip().startswith("#"):
            out.append((where, text.strip()))
    return out


def synopsis(words):
    """A usage line with placeholders (CONFIG, [options...], <pid>), not a runnable example."""
    return any("..." in w or w.startswith("[") or w.startswith("<") or re.fullmatch(r"[A-Z][A-Z0-9_]+", w)
               for w in words)


def run(argv, cwd, env=None, timeout=300):
    e = dict(os.environ, **(env or {}))
    e["PATH"] = f"{cwd}/stand-in:{cwd}/build/bin:" + e["PATH"]
    p = subprocess.run(argv, cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def help_options(sub):
    rc, text = run([PT, *sub, "--help"], WORK)
    return set(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", text)) if rc == 0 else set()


def check_options(where, cmd, sub, args):
    known = help_options(sub)
    for a in args:
        opt = a.split("=", 1)[0]
        if opt.startswith("--") and opt not in known:
            return fail(where, cmd, f"'pipetrain {' '.join(sub)} {opt}' is not among its --help options")
    counts["options checked"] = counts.get("options checked", 0) + 1


def cluster_for(config, args):
    if "--cluster" in args or any(a.startswith("--cluster=") for a in args):
        return []
    path = os.path.join(WORK, config)
    text = open(path, encoding="utf-8").read() if os.path.isfile(path) else ""
    cuda = re.search(r'^device\s*=\s*"cuda"', text, re.M) or any("runtime.device=cuda" in a or
                                                                'runtime.device="cuda"' in a for a in args)
    return ["--cluster", "inputs/clusters/" + ("dgx-h100.toml" if cuda else "cpu-node.toml")]


def check_train(where, cmd, ranks, config, args, env=None):
    argv = [PT, "check", config, "--ranks", str(ranks), "--no-data", *args, *cluster_for(config, args)]
    rc, out = run(argv, WORK, env)
    if rc != 0 or "check: ok:" not in out:
        return fail(where, cmd, f"pipetrain check {config} on {ranks} ranks: {out.strip().splitlines()[-1:]}")
    counts["checked as a run"] = counts.get("checked as a run", 0) + 1


def launched(words):
    """(ranks, the words after the launcher's own options)."""
    ranks, i = 1, 1
    while i < len(words) and words[i].startswith("-"):
        w = words[i]
        if w in ("-n", "-np", "-N", "--ntasks") and i + 1 < len(words) and words[i + 1].isdigit():
            ranks, i = int(words[i + 1]), i + 2
            continue
        if w.startswith("--ntasks="):
            ranks = int(w.split("=", 1)[1])
        i += 3 if w == "--mca" else 2 if w in ("--bind-to", "--map-by", "-x", "--hostfile", "-H", "--host") else 1
    return ranks, words[i:]


def pipetrain_command(where, cmd, words, ranks=1, env=None):
    sub, rest = words[1:2], words[2:]
    if not sub or sub[0] in ("--version", "--help"):
        rc, out = run([PT, *words[1:]], WORK, env)
        return fail(where, cmd, out) if rc else counts.__setitem__("run", counts.get("run", 0) + 1)
    s = sub[0]
    if s not in SUBCOMMANDS:
        return fail(where, cmd, f"'{s}' is not a pipetrain subcommand ({', '.join(sorted(SUBCOMMANDS))})")
    if s in ("data", "ckpt") and rest and not rest[0].startswith("-"):
        sub, rest = [s, rest[0]], rest[1:]
    if s == "train":
        return check_train(where, cmd, ranks, rest[0], rest[1:], env)
    inputs_here = all(os.path.exists(os.path.join(WORK, a)) for a in rest if not a.startswith("-") and
                      ("/" in a or "." in a) and not re.match(r"^-?\d", a)
                      and rest[rest.index(a) - 1] not in ("-o", "--out", "--output"))
    if s in ("schedule", "check") or (s == "plan" and "--calibrate" not in rest) or (s == "data" and inputs_here
                                                                                       and sub[1] == "text"):
        rc, out = run([PT, *sub, *rest], WORK, env)
        if rc != 0:
            return fail(where, cmd, f"exit {rc}: {out.strip().splitlines()[-1:]}")
        counts["run"] = counts.get("run", 0) + 1
    else:
        check_options(where, cmd, sub, rest)


def job_script(where, cmd, env, words, submitted_by=None, submit_opts=()):
    script = words[0]
    name = os.path.basename(script)
    env = dict(env)
    if name == "workstation.sh" or submitted_by:
        env["PIPETRAIN_DRY_RUN"] = "1"
        if submitted_by == "sbatch":
            ranks = next((o.split("=", 1)[1] for o in submit_opts if o.startswith("--ntasks=")), None)
            env.update(SLURM_JOB_ID="1", SLURM_NTASKS=ranks or directive_ranks(script))
        elif submitted_by == "qsub":
            select = next((o for o in submit_opts if o.startswith("select=")), None)
            env.update(PBS_JOBID="1", NRANKS=select_ranks(select) if select else directive_ranks(script))
        env["CHECK_ARGS"] = " ".join(["--no-data", *cluster_for(env.get("CONFIG", "inputs/austen-char.toml"), words)])
        rc, out = run(["bash", *words], WORK, env)
        launch = [l for l in out.splitlines() if l.startswith("dry run: ")]
        if rc != 0 or not launch:
            return fail(where, cmd, f"exit {rc}, no 'dry run:' launch line: {out.strip().splitlines()[-3:]}")
        lw = shlex.split(launch[-1][len("dry run: "):])
        ranks, lw = launched(lw)
        at = next(i for i, w in enumerate(lw) if w.endswith("pipetrain") and lw[i + 1] == "train")
        return check_train(where, cmd, ranks, lw[at + 2], lw[at + 3:])
    # Run directly: the script checks, then submits itself through the stand-in.
    log = os.path.join(WORK, "submitted.txt")
    open(log, "w").close()
    env.update(SUBMIT_LOG=log, CHECK_ARGS=" ".join(["--no-data", *cluster_for(env.get("CONFIG", "inputs/austen-char.toml"), words)]))
    rc, out = run(["bash", *words], WORK, env)
    sub = open(log).read().strip()
    if rc != 0 or not sub:
        return fail(where, cmd, f"exit {rc}, nothing submitted: {out.strip().splitlines()[-3:]}")
    counts["job scripts submitted after their check"] = counts.get("job scripts submitted after their check", 0) + 1


def select_ranks(select):
    """select=N:...:mpiprocs=M -> N x M."""
    n = re.match(r"select=(\d+)", select)
    m = re.search(r"mpiprocs=(\d+)", select)
    return str(int(n.group(1)) * int(m.group(1) if m else 1))


def directive_ranks(script):
    text = open(os.path.join(WORK, script), encoding="utf-8").read()
    tasks = re.search(r"^#SBATCH\s+--ntasks=(\d+)", text, re.M)
    nodes = re.search(r"^#SBATCH\s+--nodes=(\d+)", text, re.M)
    per = re.search(r"^#SBATCH\s+--ntasks-per-node=(\d+)", text, re.M)
    pbs = re.search(r"^#PBS\s+-l\s+select=(\d+)\S*mpiprocs=(\d+)", text, re.M)
    if tasks:
        return tasks.group(1)
    if per:
        return str(int(nodes.group(1) if nodes else 1) * int(per.group(1)))
    return str(int(pbs.group(1)) * int(pbs.group(2))) if pbs else "1"


def one(where, cmd):
    try:
        words = shlex.split(cmd, comments=True)
    except ValueError as e:
        return fail(where, cmd, f"not a shell command: {e}")
    env = {}
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    if not words:
        return
    if synopsis(words):
        counts["usage lines"] = counts.get("usage lines", 0) + 1
        return
    head = os.path.basename(words[0])
    if head in LAUNCHERS:
        ranks, rest = launched(words)
        if rest and os.path.basename(rest[0]) == "pipetrain":
            return pipetrain_command(where, cmd, rest, ranks, env)
        if rest and os.path.basename(rest[0]).startswith("bench_"):  # minutes each: bench/RESULTS.md's
            counts["benchmarks (not run)"] = counts.get("benchmarks (not run)", 0) + 1
            return
        return fail(where, cmd, "a launcher example that does not start pipetrain")
    if head == "pipetrain":
        return pipetrain_command(where, cmd, words, 1, env)
    if head in ("sbatch", "qsub"):
        i, opts = 1, []
        while i < len(words) and words[i].startswith("-"):
            if words[i] == "-v" and i + 1 < len(words):  # qsub -v A=x,B="y z"
                for kv in re.split(r",(?=[A-Z_]+=)", words[i + 1]):
                    k, v = kv.split("=", 1)
                    env[k] = v
                i += 2
                continue
            if words[i] == "-l" and i + 1 < len(words):  # qsub -l select=...
                opts.append(words[i + 1])
                i += 2
                continue
            opts.append(words[i])
            i += 1
        return job_script(where, cmd, env, words[i:], head, opts)
    if words[0].startswith("jobscripts/"):
        return job_script(where, cmd, env, words)
    counts["not pipetrain commands"] = counts.get("not pipetrain commands", 0) + 1


WORK = tempfile.mkdtemp(prefix="pipetrain-examples.")
try:
    for d in ("inputs", "jobscripts"):
        os.symlink(os.path.join(SRC, d), os.path.join(WORK, d))
    os.makedirs(os.path.join(WORK, "build/bin"))
    os.makedirs(os.path.join(WORK, "stand-in"))
    os.symlink(PT, os.path.join(WORK, "build/bin/pipetrain"))
    for tool in ("sbatch", "qsub"):
        with open(os.path.join(WORK, "stand-in", tool), "w") as f:
            f.write('#!/bin/sh\nprintf "%s\\n" "$*" >>"$SUBMIT_LOG"\necho "Submitted batch job 1001"\n')
        os.chmod(os.path.join(WORK, "stand-in", tool), 0o755)
    SUBCOMMANDS = set(re.findall(r"^\s{2}([a-z]+)\s", run([PT, "--help"], WORK)[1].split("Subcommands:")[-1], re.M))
    found = examples()
    # The data first: other examples read what `pipetrain data text` writes.
    found.sort(key=lambda e: 0 if re.search(r"pipetrain data text", e[1]) else 1)
    for where, cmd in found:
        started = time.time()
        one(where, cmd)
        if os.environ.get("EXAMPLES_VERBOSE"):
            print(f"{time.time() - started:6.1f} s  {where}: {cmd}")
    total = sum(counts.values()) + len(failures)
    print(f"{total} examples: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    if total < 20:
        failures.append(f"only {total} examples found in {SRC}: the extraction is broken")
    for f in failures:
        print("FAIL: " + f)
    sys.exit(1 if failures else 0)
finally:
    shutil.rmtree(WORK, ignore_errors=True)
