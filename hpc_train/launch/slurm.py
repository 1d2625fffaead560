"""``cluster=slurm``: submit one job (or one array for a sweep) and return, or follow it with ``cluster.slurm.wait``.

Two ways to submit, same resources: ``cluster.slurm.submit=submitit`` (submitit's SlurmExecutor pickles a call of
``hpc_train.supervisor.run``) and ``cluster.slurm.submit=sbatch`` (the standalone script in the run dir, ``sbatch``-ed).
Either way the job's batch step runs the supervisor, which runs the training step with srun and restarts it in
the allocation after a failure.
Either way the generated script is checked with ``sbatch --test-only`` first where sbatch exists, so a wrong
partition or an impossible request fails here, before anything is queued.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpc_train.config import Config
from hpc_train.core import owner
from hpc_train.core.errors import ExitCode, LaunchError
from hpc_train.core.files import atomic_write
from hpc_train.core.records import JobRecord, PackPlace
from hpc_train.core.rundir import RunDir
from hpc_train.core.signals import held
from hpc_train.core.textutil import plural
from hpc_train.launch.facts import ClusterFacts, check_pack, check_request, explain_slurm_refusal, facts_for
from hpc_train.launch.here import inside_allocation, launch_here
from hpc_train.launch.sbatch import (
    JobSpec,
    emulate_rank_table,
    format_emulated_table,
    job_spec,
    render_sbatch,
    setup_lines,
)
from hpc_train.launch.shapes import format_shape_table, shape_table
from hpc_train.launch.state import job_state
from hpc_train.runtime.grow import requeue_goes_behind
from hpc_train.runtime.timeouts import derive_lead, kill_wait_s, measured, timeouts

__all__ = ["follow_slurm", "launch_slurm", "submit_slurm"]

POLL_S = 1.0
SUBMIT_TIMEOUT_S = 60
SUBMITTED: list[tuple[str, Path]] = []
"""The jobs this process had Slurm accept, with their run dirs: what an interrupt leaves running."""


def launch_slurm(cfg: Config, run_dir: RunDir) -> int:
    """Submit the job of ``run_dir`` (or print it, with ``cluster.slurm.dry_run``); follow it with ``cluster.slurm.wait``.
    With ``cluster.slurm.submit=here``, train in the allocation this shell holds instead."""
    if cfg.cluster.slurm.submit == "here":
        return launch_here(cfg, run_dir)
    if inside_allocation():
        print(
            f"hpc_train: this shell holds Slurm allocation {os.environ['SLURM_JOB_ID']}; this submits a new job. "
            "cluster.slurm.submit=here would train on the allocation's nodes instead, with no queue wait.",
            file=sys.stderr,
        )
    job_ids = submit_slurm(cfg, [run_dir], log_dir=run_dir.logs)
    if not job_ids:
        return 0
    print(f"hpc_train: submitted Slurm job {job_ids[0]}. Run dir: {run_dir.path}")
    print(f"  status:  python -m hpc_train.jobs status {run_dir.path}")
    print(f"  logs:    python -m hpc_train.jobs logs {run_dir.path} --follow   (rank 0; --rank N for another)")
    print(f"  cancel:  python -m hpc_train.jobs cancel {run_dir.path}", flush=True)
    if cfg.cluster.slurm.wait:
        return follow_slurm(run_dir, cfg.cluster.world_size, limit_s=cfg.cluster.timeout_min * 60 + 600)
    return 0


def _stop_following(run_dir: RunDir, why: str) -> None:
    print(
        f"hpc_train: {why}; the job goes on. Follow it with: python -m hpc_train.jobs logs {run_dir.path} --follow",
        file=sys.stderr,
    )


def submit_slurm(
    cfg: Config,
    run_dirs: Sequence[RunDir],
    log_dir: Path,
    overrides: Sequence[Sequence[str]] = (),
    mirrors: Sequence[str] = (),
) -> list[str]:
    """Submit one job per run dir, as one array when there are several; returns the job ids (none on dry runs).
    ``mirrors``: each run dir's trainer.mirror (default: ``cfg``'s for each).

    Each run dir is owned by its job once submitted (``hpc_train.core.owner``): until the job ends, another
    launch into it is refused. A run dir this process has not claimed yet (a sweep's element) is claimed here,
    before the submission, and given back if nothing is submitted."""
    # hpc_train.launch imports this module
    from hpc_train.launch import claim_run_dir

    leases: list[owner.Lease] = []
    claimed: list[owner.Lease] = []
    try:
        for rd in run_dirs:
            lease = owner.held(rd.path)
            if lease is None:
                lease = claim_run_dir(cfg, rd)
                claimed.append(lease)
            leases.append(lease)
        return _submit(cfg, run_dirs, log_dir, overrides, leases, mirrors or [cfg.trainer.mirror] * len(run_dirs))
    finally:
        for lease in claimed:
            lease.release()  # nothing when it was handed to its job


def _submit(
    cfg: Config,
    run_dirs: Sequence[RunDir],
    log_dir: Path,
    overrides: Sequence[Sequence[str]],
    leases: Sequence[owner.Lease],
    mirrors: Sequence[str],
) -> list[str]:
    # Live Slurm where it answers (a dry run too), else the facts a profile recorded, if any.
    lead = _timeouts(cfg, run_dirs)
    paths = [rd.path for rd in run_dirs]
    spec = job_spec(cfg.cluster, paths, log_dir, pack=cfg.cluster.pack, lead_s=lead, mirrors=mirrors)
    if any(mirrors) and (not spec.mirrors or cfg.cluster.slurm.submit != "sbatch"):
        print(
            "hpc_train: note: with trainer.mirror, a job whose run dir a scratch purge empties while it is queued "
            "comes back from the mirror with cluster.slurm.submit=sbatch and no cluster.pack only (submitit reads "
            "its job from the run dir before hpc_train runs). The copies are made either way, and `python -m "
            "hpc_train.jobs pull MIRROR RUN_DIR` brings a run back by hand.",
            file=sys.stderr,
        )
    facts = facts_for(cfg.cluster, live=True)
    if facts is not None:
        check_request(cfg.cluster, facts)
        check_pack(cfg.cluster, facts, spec.pack)
    # One job's script is in its run dir; an array's, with Slurm's output files, in the sweep's log folder.
    script = run_dirs[0].sbatch_script if len(run_dirs) == 1 else log_dir / run_dirs[0].sbatch_script.name
    log_dir.mkdir(parents=True, exist_ok=True)  # Slurm does not create the folder of --output
    text = render_sbatch(spec)
    atomic_write(script, lambda f: f.write(text.encode()))
    if cfg.cluster.asks_range:
        chosen = _choose_shape(cfg, run_dirs[0], spec, script)
        if chosen is not spec:
            spec, text = chosen, render_sbatch(chosen)
            atomic_write(script, lambda f: f.write(text.encode()))
    if cfg.cluster.slurm.dry_run:
        checked = _test_only(script)
        _print_dry_run(cfg, text, script)
        print(_what_was_checked(facts, checked), flush=True)
        return []
    _test_only(script)
    for rd in run_dirs:
        rd.clear_statuses()
        rd.cancel_request.unlink(missing_ok=True)  # (a member cancelled alone before, submitted again)
    # From sbatch's answer to the job record, Ctrl-C and SIGTERM wait: a job Slurm accepted gets its run dir
    # and its record whatever happens to this process (a signal then says so: ``hpc_train.__main__``).
    with held():
        if cfg.cluster.slurm.submit == "sbatch":
            array_id, outputs = _submit_sbatch(script, spec)
        else:
            array_id, outputs = _submit_submitit(cfg, spec, run_dirs, log_dir)
        # One id per run dir: the members of a pack share their job's.
        job_ids = [f"{array_id}_{i // spec.pack}" if spec.is_array else array_id for i in range(len(run_dirs))]
        SUBMITTED.extend(zip(job_ids, (rd.path for rd in run_dirs), strict=True))
        for lease, job_id in zip(leases, job_ids, strict=True):
            lease.hand_to_job(job_id)  # first: from here on the job owns its run dir
        for i, rd in enumerate(run_dirs):
            element = i // spec.pack
            members = run_dirs[element * spec.pack : (element + 1) * spec.pack]
            record = JobRecord(
                scheduler="slurm",
                submit=cfg.cluster.slurm.submit,
                job_id=job_ids[i],
                array_job_id=array_id if spec.is_array else None,
                array_index=element if spec.is_array else None,
                script=str(script),
                slurm_output=outputs[element],
                world_size=cfg.cluster.world_size,
                nodes=str(spec.flags["nodes"]),  # what the job asked Slurm for: a count, or a range
                overrides=tuple(overrides[i]) if overrides else (),
                submitted=time.time(),
                # The runs it shares its job with, itself included, in the order of the sweep (cluster.pack).
                pack=PackPlace(index=i % spec.pack, members=tuple(str(m.path.resolve()) for m in members))
                if spec.packed
                else None,
            )
            rd.write_job_record(record)
    return job_ids


def _timeouts(cfg: Config, run_dirs: Sequence[RunDir]) -> int:
    """Print the timeout hierarchy (``runtime.timeouts``) against what the first run dir measured, with a warning
    for each pair a measurement shows inverted; the signal lead to submit (with ``auto``, the longest any of
    the run dirs needs: an array shares one script)."""
    kill_wait = kill_wait_s()
    found = [measured(rd) for rd in run_dirs]
    lead = max((derive_lead(cfg, each) for each in found), key=lambda each: each.seconds)
    hierarchy = timeouts(cfg, found[0], kill_wait, lead)
    print("\n".join(hierarchy.lines()), flush=True)
    for warning in hierarchy.warnings():
        print(f"hpc_train: WARNING: {warning}", file=sys.stderr, flush=True)
    return lead.seconds


def _choose_shape(cfg: Config, run_dir: RunDir, spec: JobSpec, script: Path) -> JobSpec:
    """Print when each node count of the range would start and finish (``launch.shapes``: Slurm is asked about
    the job of ``script``); the spec to submit: the range, or with cluster.slurm.shape=earliest_finish the count
    that finishes first (spares on top)."""
    cluster = cfg.cluster
    table = shape_table(cfg, run_dir, script)
    asked = f"asking for {cluster.nodes_request} nodes"
    print(format_shape_table(table, asked, cluster.slurm.shape), flush=True)
    best = table.earliest
    if cluster.slurm.shape != "earliest_finish" or best is None:
        return spec
    return replace(spec, flags={**spec.flags, "nodes": str(best.nodes + cluster.slurm.spare_nodes)})


def _print_dry_run(cfg: Config, text: str, script: Path) -> None:
    print(f"hpc_train: dry run; nothing submitted. Script written to {script}:\n")
    print(text)
    shape = f"{plural(cfg.cluster.nodes, 'node')} x {plural(cfg.cluster.tasks_per_node, 'task')}"
    print(f"Expected ranks ({shape}; node names are")
    print("placeholders and the port is the one job id 12345 would get: each job derives its own):")
    print(format_emulated_table(emulate_rank_table(cfg.cluster)), flush=True)


def _command(argv: list[str], what: str) -> str:
    """The command's stdout; LaunchError (with its stderr) when it fails or does not answer in time."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"{what} did not answer within {SUBMIT_TIMEOUT_S}s: {' '.join(argv)}") from None
    if proc.returncode != 0:
        words = proc.stderr.strip() or proc.stdout.strip()
        raise LaunchError(f"Slurm refused the request ({what}, exit {proc.returncode}): {explain_slurm_refusal(words)}")
    return proc.stdout


def _test_only(script: Path) -> bool:
    """Let Slurm judge the request without queuing it (bad partition, account, too many nodes...); False when
    there is no sbatch here to ask."""
    if shutil.which("sbatch") is None:
        return False
    _command(["sbatch", "--test-only", str(script)], f"sbatch --test-only {script} (the request was not submitted)")
    return True


def _what_was_checked(facts: ClusterFacts | None, test_only: bool) -> str:
    """The dry run's last line: what the request was checked against, and what was not checked at all."""
    checks = [f"against the cluster's partitions and limits ({facts.source})"] if facts is not None else []
    if test_only:
        checks.append("by Slurm itself (sbatch --test-only)")
    if checks:
        return f"hpc_train: dry run checked the request {' and '.join(checks)}.{_generation(facts)}"
    return (
        "hpc_train: dry run did NOT check the request: no Slurm answers here and the profile records no "
        "cluster.facts, so the partition, node count, memory and time limit are unchecked. HINT: run the dry run "
        "on a login node, or write the profile there with `python -m hpc_train.profile --write NAME`."
    )


def _generation(facts: ClusterFacts | None) -> str:
    """Which Slurm the request went to, and the rule of its generation that hpc_train applies (the behaviours
    that do not differ from 22.05 to 24.11 are in docs/slurm-reference.md)."""
    version = facts.slurm_version if facts is not None else None
    if version is None:
        return ""
    behind, why = requeue_goes_behind(version, None, None, requeued=False)
    rule = "a growth waits while other jobs wait in the partition" if behind else "a growth does not wait for others"
    return f" {why}, so {rule}."


def _submit_sbatch(script: Path, spec: JobSpec) -> tuple[str, list[str]]:
    if shutil.which("sbatch") is None:
        raise LaunchError(
            "sbatch is not on PATH. HINT: submit from a login node, or use cluster.slurm.dry_run=true to write the script"
        )
    out = _command(["sbatch", "--parsable", str(script)], "sbatch")
    job_id = out.strip().splitlines()[-1].split(";")[0]  # --parsable: "<id>[;<cluster>]"; warnings go to stderr
    if spec.is_array:
        outputs = [spec.output.replace("%A", job_id).replace("%a", str(i)) for i in range(spec.jobs)]
    else:
        outputs = [spec.output.replace("%j", job_id)]
    return job_id, outputs


def _submit_submitit(cfg: Config, spec: JobSpec, run_dirs: Sequence[RunDir], log_dir: Path) -> tuple[str, list[str]]:
    # submitit only for cluster.slurm.submit=submitit
    import submitit

    from hpc_train.runtime import supervisor

    cluster = cfg.cluster
    folder = run_dirs[0].submitit if len(run_dirs) == 1 else log_dir / run_dirs[0].submitit.name
    # submitit writes `python` into its script as it is, unquoted: quote it here.
    executor = submitit.SlurmExecutor(folder=folder, python=shlex.join(spec.python_command), max_num_timeout=0)
    flags = dict(spec.flags)
    params: dict[str, Any] = {
        "nodes": cluster.allocated_nodes,
        "cpus_per_task": int(flags.pop("cpus-per-task") or 1),  # a node range's: a node's CPUs (sbatch_flags)
        "time": int(flags.pop("time") or 1),
        "job_name": cluster.slurm.job_name,
        # submitit's script runs srun in the foreground with no trap: `scancel --signal=USR2 --full` would kill
        # the batch shell and fail the job while the ranks checkpoint. The ranks handle the signal; not bash.
        "setup": [
            shlex.join(["trap", f"echo 'hpc_train: batch shell got SIG{spec.signal}' >&2", spec.signal]),
            *setup_lines(cluster),
        ],
        # The batch step runs the supervisor, which runs the training steps with srun (and again after a failure).
        "use_srun": False,
        "array_parallelism": cluster.slurm.array_parallelism or spec.jobs,
    }
    if "ntasks-per-node" in flags:  # (not for a node range: sbatch_flags)
        params["ntasks_per_node"] = int(flags.pop("ntasks-per-node") or 1)  # a pack's: its members' tasks together
    flags.pop("job-name")
    # submitit takes nodes as a number (it counts the job's tasks with it): a range (cluster.min_nodes) goes
    # through additional_parameters, which submitit writes over its own --nodes line.
    if not cluster.asks_range:
        flags.pop("nodes")
    # signal, GPUs, partition, account, ... and cluster.slurm.sbatch_args; submitit writes True as a bare flag.
    params["additional_parameters"] = {k: True if v is None else v for k, v in flags.items()}
    executor.update_parameters(**params)
    paths = [str(rd.path) for rd in run_dirs]
    try:
        if spec.packed:
            packs = [paths[i : i + spec.pack] for i in range(0, len(paths), spec.pack)]
            if len(packs) == 1:
                jobs = [executor.submit(supervisor.run_packed, packs[0])]
            else:
                jobs = executor.map_array(supervisor.run_packed, packs)
        elif len(run_dirs) == 1:
            jobs = [executor.submit(supervisor.run, paths[0])]
        else:
            jobs = executor.map_array(supervisor.run, paths)
    except Exception as exc:
        raise LaunchError(f"submitit could not submit the job: {explain_slurm_refusal(str(exc))}") from exc
    array_id = jobs[0].job_id.split("_")[0]
    return array_id, [str(job.paths.stdout).replace("%t", "0") for job in jobs]


def follow_slurm(run_dir: RunDir, world_size: int, limit_s: float, rank: int = 0) -> int:
    """Print the rank's log as it grows until the job ends; 0 when it completed, 1 otherwise (130: Ctrl-C)."""
    try:
        return _follow(run_dir, world_size, limit_s, rank)
    except KeyboardInterrupt:
        _stop_following(run_dir, "interrupted")
        return ExitCode.INTERRUPTED


def _follow(run_dir: RunDir, world_size: int, limit_s: float, rank: int) -> int:
    tail = run_dir.follow_log(rank, sys.stdout)
    deadline = time.monotonic() + limit_s
    last = ""
    while True:
        tail.pump()
        state = job_state(run_dir, world_size)
        job = f"job {state.job_id}" if state.job_id else "the local run"
        if state.state != last:
            print(f"hpc_train: {job} is {state.state}", file=sys.stderr, flush=True)
            last = state.state
        if state.done:
            tail.pump()
            verdict = "completed" if state.ok else f"ended {state.state}"
            stream = sys.stdout if state.ok else sys.stderr
            print(f"hpc_train: {job} {verdict}. {state.detail}. Run dir: {run_dir.path}", file=stream)
            return ExitCode.OK if state.ok else ExitCode.FAILED
        if time.monotonic() > deadline:
            _stop_following(run_dir, f"stopped following after {limit_s:.0f}s with {job} {state.state}")
            return ExitCode.FAILED
        time.sleep(POLL_S)
