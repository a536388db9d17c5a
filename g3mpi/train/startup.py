"""Start-up of a training rank: its part loaded and checked against the other ranks', then its trainer built.

Every rank runs the same steps in the same order. After each step that can fail on some ranks only, the ranks
agree (:meth:`Protocol.agree`: one text allgather of their errors) before any rank goes on to the next
collective, so that a failure anywhere stops every rank at the same step with a non-zero exit, never a hang, and
the job says it once: rank 0 writes one line per distinct error, naming the ranks that had it
(``g3-train: error: [ranks 0-3] ...``, :mod:`g3mpi.mpi.report`):

1. the configuration check (:func:`g3mpi.cli.train.config_check`), every rank's first collective, once its command
   line is read (before torch is imported: a bad one ends the job in a fraction of the start-up);
2. ``device``: the rank's device (``--device``, :mod:`.device`: its GPU from its place on its node);
3. ``run directory``: rank 0 checks that ``--out`` can be created (:func:`~.rundir.check_run_dir`), before any
   part is read (it is made after step 8, so that a model that does not fit leaves no run directory);
4. ``part files``: meta.json and the rank's own part (:func:`read_rank_part`, which the bench's worker uses too),
   whose labels fit ``--task``;
5. ``halo lists``: each neighbour sends the rows this rank expects (:mod:`g3mpi.comm.consistency`); with
   ``--task link``, ``held-out pairs``: no val or test pair is an edge of its target's part (a part edited since
   g3-partition), each looked up on the target's owner;
6. ``split sizes``: the graph's training, validation and test counts, and that the parts own every node ID
   exactly once (:func:`start_up_sums`, which the bench's worker uses too);
7. ``checkpoint`` (``--resume``) or ``initial model`` (``--init-from``): read and checked against the settings;
8. the trainer built, then the checkpoint's states or the initial parameters checked against its model.

A failure inside a collective, where other ranks may wait, ends the job at once (``abort_job``, with the rank's
own line) instead. Every wait has the watchdog's deadline (``--comm-timeout``; adaptive by default, then from the
largest part's size once meta.json is read): a rank that never arrives ends the job naming the step.
"""
from __future__ import annotations

import json
import logging
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from g3mpi.comm.consistency import check_neighbours
from g3mpi.comm.pairs import first_edge_of_graph
from g3mpi.format import FormatError, open_graph, part_name, read_meta, read_part
from g3mpi.format.links import HELD_OUT, link_name
from g3mpi.format.partition import id_checksum, range_checksum
from g3mpi.log import node_name
from g3mpi.mpi.abort import abort_job
from g3mpi.mpi.fail import fail_job
from g3mpi.mpi.report import report
from g3mpi.mpi.watchdog import Watchdog
from g3mpi.nn import specs

from .checkpoint import (CHECKPOINT_NAME, CheckpointError, check_compatible, check_restorable, load_checkpoint,
                         load_model_state, merge_shard, state_mismatch)
from .config import ConfigError, TrainConfig, settings_without_effect
from .device import mpi_cuda_support, select_device, use_cuda_aware
from .faults import TestHooks
from .memory import largest_part_bytes
from .phases import Phases
from .rundir import SPLITS, check_run_dir
from .link import link_misfit
from .tasks import label_misfit
from .trainer import Trainer
from .userfile import ModelFileError, load_builder, UserExit, code_frame, reason, user_frame

PROG = "g3-train"
log = logging.getLogger("g3mpi")
#: what the start-up sums found when two parts own the same original node ID
IDS_NOT_ONCE = ("the parts do not own every original node ID exactly once (two parts own the same node; "
                "g3-inspect names the part whose IDs disagree with node_map.h5)")
#: the devices the training runtime computes on so far (the CUDA path of issue 28 is not in yet)
RUNTIME_DEVICES = ("cpu",)
#: the devices the pair exchange of ``--task link`` computes on (``g3mpi.ops.pairs``: host buffers only so far)
PAIR_DEVICES = ("cpu",)


class StartupFailed(Exception):
    """Start-up stopped on this rank, its line out (and, but after an abort, every other rank's): exit ``code``."""

    def __init__(self, code: int = 1):
        super().__init__(code)
        self.code = code


class Protocol:
    """One rank's lines and agreements at start-up (and at the end of a run), on the ``watchdog``'s communicator
    and with its deadline."""

    def __init__(self, watchdog: Watchdog, prog: str = PROG):
        self.watchdog, self.comm, self.prog = watchdog, watchdog.comm, prog

    def line(self, msg: str) -> str:
        return f"{self.prog}: error: [rank {self.comm.rank}] {msg}"

    def agree(self, err: str | None, check: str) -> None:
        """Every rank learns whether any rank failed (``err``: this rank's error or None); unless all succeeded,
        rank 0 writes the job's lines (:func:`g3mpi.mpi.report.report`: one per distinct error, naming its ranks)
        and :class:`StartupFailed` is raised on every rank. The waits name the start-up ``check``."""
        errs = self.watchdog.allgather_text(err, f"start-up check {check!r}")
        if not any(e is not None for e in errs):
            return
        report(self.comm.rank, self.prog, errs)
        self.all_out(f"start-up check {check!r}")

    def same(self, err: str, check: str) -> None:
        """A failure that every rank found alike (from values every rank has): rank 0's one line for all ranks,
        then :class:`StartupFailed` on every rank."""
        report(self.comm.rank, self.prog, [err] * self.comm.size)
        self.all_out(f"start-up check {check!r}")

    def all_out(self, what: str) -> None:
        """Rank 0's lines are out before any rank exits (under ``python -m mpi4py`` the first non-zero exit
        aborts the rest): a barrier, then :class:`StartupFailed`."""
        self.watchdog.barrier(f"{what} (every rank's line is out before the job ends)")
        raise StartupFailed(1)

    def abort(self, msg: str) -> None:
        """End the job from this rank alone (a failure where the other ranks may wait in a collective)."""
        abort_job(self.comm, self.line(msg))
        raise StartupFailed(1)

    def fail(self, msg: str) -> None:
        """End the job after a failure on some ranks where the others may wait for them (in an exchange of the
        model's forward), with one line per distinct message for the failing ranks
        (:func:`g3mpi.mpi.fail.fail_job`)."""
        fail_job(self.comm, self.prog, msg)
        raise StartupFailed(1)


def not_a_partition(path, ranks: int) -> str:
    """Why the file ``path``, given as a partition directory, is not one, and what to do (``ranks``: the number
    of parts to ask for)."""
    try:
        with open_graph(path):
            pass
    except FormatError:
        return "is a file, not a partition directory (meta.json + part-*.h5, written by g3-partition)"
    return f"is a graph file; partition it: g3-partition {path} --parts {ranks} --out DIR, then --parts DIR"


def read_rank_part(parts: str, comm, verify: bool = True):
    """(meta.json, this rank's part) of the partition directory ``parts``; FormatError (naming the file) when it
    has not one part per rank of ``comm`` or the part is bad."""
    meta = read_fitting_meta(parts, comm.size)
    return meta, read_part(parts, comm.rank, meta, verify=verify)


def read_fitting_meta(parts: str, ranks: int, started: str = "started") -> dict:
    """meta.json of the partition directory ``parts``; FormatError (naming the file) unless it has one part per
    rank of the ``ranks`` the job has ``started`` (or, for ``g3-train --check P``, requested)."""
    if Path(parts).is_file():
        raise FormatError(parts, not_a_partition(parts, ranks))
    meta = read_meta(parts)
    if meta["num_parts"] != ranks:
        raise FormatError(f"{parts}/meta.json",
                          f"the partition has {meta['num_parts']} parts but {ranks} "
                          f"{'rank was' if ranks == 1 else 'ranks were'} {started} "
                          f"(run with mpiexec -n {meta['num_parts']})")
    return meta


def check_job(cfg: TrainConfig, resume: str | None, ranks: int) -> str | None:
    """Why a job of ``ranks`` ranks would stop at start-up, from what needs no part's data (``g3-train --check
    P``, which the job scripts run before they launch anything): a partition of ``ranks`` parts with every part
    file there, a run directory that can be made (not on ``--resume``), a model file that imports and has its
    function. None if it would pass them. The checks that read the parts, the checkpoint and the initial
    parameters are the ranks' own (``mpiexec -n P g3-train --check``)."""
    try:
        read_fitting_meta(cfg.parts, ranks, "requested")
        missing = [part_name(r) for r in range(ranks) if not (Path(cfg.parts) / part_name(r)).is_file()]
        if missing:
            return f"{cfg.parts}/{missing[0]}: no such file ({len(missing)} of the {ranks} part files missing)"
        if not resume:
            check_run_dir(cfg)
        if cfg.model_file:
            load_builder(cfg.model_file)
    except (FormatError, ValueError, ModelFileError) as e:
        return str(e)
    except OSError as e:
        return f"{e.filename or cfg.out}: cannot be read: {e.strerror or e}"
    return None


def start_up_sums(part, watchdog: Watchdog) -> tuple[dict, bool]:
    """What the ranks learn together at start-up, in one ``Allreduce`` (every rank calls it): the number of
    training, validation and test nodes of the whole graph (``{"train": ..., "val": ..., "test": ...}``), and
    whether the parts own every original node ID exactly once. Each part checks its own IDs on load (in range,
    strictly increasing); that no two parts own the same ID is the sum of the parts'
    :func:`~g3mpi.format.partition.id_checksum` against that of ``range(N)``, whose share each rank computes: that
    of its own new-ID range, as long as its original IDs (the new ranges of the parts tile ``range(N)``), so a
    rank's work is O(owned), whatever N is."""
    ids = (id_checksum(part.orig_ids) - range_checksum(part.owned_start, part.owned_end)) % (1 << 64)
    sums = np.array([int(getattr(part, f"{s}_mask").sum()) for s in SPLITS] + [ids], dtype=np.uint64)
    watchdog.allreduce(sums, what="start-up check 'split sizes'")   # (uint64 sums wrap: the checksum's modulus)
    return dict(zip(SPLITS, map(int, sums[:len(SPLITS)]))), int(sums[-1]) == 0


def model_args(cfg: TrainConfig) -> str:
    """The settings that shape the model's parameters, as options (for messages)."""
    if cfg.model_file:
        return f"--model-file {cfg.model_file}"
    heads = f" --heads {cfg.heads} --out-heads {cfg.out_heads}" if specs.spec(cfg.model).attention else ""
    return f"--model {cfg.model} --layers {cfg.layers} --hidden {cfg.hidden}{heads}{recipe_args(cfg)}"


def recipe_args(cfg: TrainConfig) -> str:
    """The recipe blocks (docs/RECIPES.md) the model has, as options (" --residual --norm batch"; "" for none:
    appnp and gcn2 have their own stacks, whose parameters k, alpha and theta do not shape)."""
    if not specs.spec(cfg.model).recipe:
        return ""
    on = [f" --{k.replace('_', '-')}" for k in ("residual", "input_linear", "output_linear", "ffn") if getattr(cfg, k)]
    return "".join(on) + "".join(f" --{k} {getattr(cfg, k)}" for k in ("norm", "jk") if getattr(cfg, k) != "none")


def failure(what: str, e: BaseException, cfg: TrainConfig, part, where: str = "") -> str:
    """The line for an unexpected failure while ``what`` ran (``where``: e.g. ``epoch 3``): for memory that
    could not be allocated (torch says so in a RuntimeError) what was asked for and of which model; else the
    exception and the line that raised it, of the model file when it was there. The traceback follows only with
    ``--debug``."""
    text = str(e).strip().splitlines()[-1] if str(e).strip() else ""
    at = f" ({where})" if where else ""
    if isinstance(e, MemoryError) or "can't allocate memory" in text:
        return (f"{what} ran out of memory{at} ({model_args(cfg)}, {part.num_classes} classes, {part.num_owned} "
                f"owned and {part.num_halo} halo nodes of {part.feature_dim} features on this rank): "
                f"{type(e).__name__}: {text}")
    mine = user_frame(cfg.model_file, e) if cfg.model_file else None
    if mine:
        verb = "called" if isinstance(e, (SystemExit, UserExit)) else "raised"
        line = f"{mine}: the model {verb} {reason(e)} in {what}{at}"
    else:
        line = f"{what} failed{at}: {reason(e)} (at {code_frame(e)}; --debug shows the traceback)"
    if cfg.debug:
        line += "\n" + "".join(traceback.format_exception(e)).rstrip()
    return line


@dataclass
class Started:
    """A rank ready to train: its trainer (restored or started from the given parameters by the caller), part,
    meta.json, test hooks, and the checkpoint (``--resume``) and initial parameters (``--init-from``) it has."""
    trainer: Trainer
    part: object
    meta: dict
    hooks: TestHooks
    ckpt: dict | None
    init: dict | None


def start(proto: Protocol, cfg: TrainConfig, stop, resume: str | None, phases: Phases) -> Started:
    """Steps 2 to 8 (the module's list) for g3-train: :class:`StartupFailed` on every rank when one fails.
    ``stop``: the run's :class:`~g3mpi.mpi.stop.StopSignals`; ``resume``: the run directory to continue;
    ``phases``: marked as each step ends."""
    select_rank_device(proto, cfg)
    phases.mark("device")
    if not resume:
        _check_run_dir(proto, cfg)
    phases.mark("run directory")
    part, meta, hooks = _load_part(proto, cfg)
    phases.mark("part files")
    hooks.stall_at("startup")
    _check_halo(proto, cfg, part)
    phases.mark("halo lists")
    if cfg.task == "link":
        _check_held_out(proto, cfg, part)
        phases.mark("held-out pairs")
    split_sizes = _split_sizes(proto, cfg, part)
    phases.mark("split sizes")
    ckpt = _read_checkpoint(proto, cfg, meta, part, resume) if resume else None
    init = _read_initial(proto, cfg) if cfg.init_from and not resume else None   # (a resumed run's: its checkpoint)
    phases.mark("checkpoint")
    log.info("part %d on node %s: %d owned, %d halo, %d local edges; model %s", part.part_id, node_name(),
             part.num_owned, part.num_halo, int(part.indptr[-1]), cfg.model_label)
    # the model is built before the run directory is made, so that parameters that do not fit it leave no run
    trainer, err = None, None
    try:
        trainer = Trainer(cfg, proto.comm, part, meta, split_sizes, stop=stop, watchdog=proto.watchdog, hooks=hooks)
    except ModelFileError as e:     # (a user's model file: every rank says why, as at the other checks)
        err = str(e)
    except BaseException as e:  # noqa: BLE001 - one failing rank must not leave the others waiting
        proto.fail(failure("setting up training", e, cfg, part))
    try:
        if cfg.model_file:
            proto.agree(err, "model file")
        _check_same_parameters(proto, cfg, trainer)
        if cfg.model_file:
            try:
                trainer.check_model_output()
            except ModelFileError as e:   # (the others may wait for this rank in the forward's exchanges)
                proto.fail(str(e))
        _check_fit(proto, cfg, part, trainer, ckpt, init, resume)
    except StartupFailed:
        if trainer is not None:
            trainer.close()
        raise
    phases.mark("trainer")
    return Started(trainer, part, meta, hooks, ckpt, init)


def parameter_mismatch(lists: list) -> str | None:
    """Why the ranks' models differ, from every rank's ``[[name, shape], ...]`` (rank order), or None: the first
    parameter whose name or shape differs from rank 0's, and the ranks where it does."""
    ref = lists[0]
    bad = [r for r, ps in enumerate(lists) if ps != ref]
    if not bad:
        return None
    r = bad[0]
    names, theirs = {n for n, _ in ref}, lists[r]
    for i, (n, s) in enumerate(theirs):
        if i >= len(ref) or n != ref[i][0]:
            what = (f"{n} is a parameter on rank {r} but not on rank 0" if n not in names else
                    f"the parameters come in another order on rank {r} than on rank 0 ({n})")
            break
        if list(s) != list(ref[i][1]):
            what = f"{n} is {list(ref[i][1])} on rank 0 but {list(s)} on rank {r}"
            break
    else:
        n = ref[len(theirs)][0]
        what = f"{n} is a parameter on rank 0 but not on rank {r}"
    return (f"the model's parameters differ between ranks ({'rank' if len(bad) == 1 else 'ranks'} "
            f"{', '.join(map(str, bad))} against rank 0): {what}; every rank must build the same parameters")


def _check_same_parameters(proto: Protocol, cfg: TrainConfig, trainer: Trainer) -> None:
    """The ranks' models have the same parameter names and shapes (one text allgather), before any exchange of
    theirs: a model that differs (a user's build that reads its rank) is refused naming the parameter, instead of
    mismatched messages or a gradient allreduce of other sizes."""
    # (a node-embedding table has this rank's owned rows: only its width must agree)
    mine = json.dumps([[n, ["owned", *p.shape[1:]] if n in trainer.sharded else list(p.shape)]
                       for n, p in trainer.model.named_parameters()])
    lists = [json.loads(t) for t in proto.watchdog.allgather_text(mine, "start-up check 'model parameters'")]
    why = parameter_mismatch(lists)
    if why:
        proto.same(f"{cfg.model_file.rpartition(':')[0]}: {why}" if cfg.model_file else why, "model parameters")


def select_rank_device(proto: Protocol, cfg: TrainConfig, cuda_count: int | None = None):
    """Step 2: this rank's device (:func:`~.device.select_device`; ``cuda_count``: the GPUs it sees, default
    torch's count) and whether its messages leave from device memory (:func:`~.device.use_cuda_aware`), agreed on
    by every rank: (device, CUDA-aware). A device the runtime does not compute on yet (``RUNTIME_DEVICES``) is
    refused here, before any part is read."""
    if cfg.device == "cpu":     # no collective: a CPU run starts as it always has
        return torch.device("cpu"), False
    err, device, direct = None, None, False
    try:
        device = select_device(proto.comm, cfg.device, cfg.oversubscribe_gpus, cuda_count)
        direct = use_cuda_aware(cfg.cuda_aware, device, mpi_cuda_support() if device.type == "cuda" else False)
        if device.type not in RUNTIME_DEVICES:
            err = (f"--device {cfg.device}: this rank would compute on {device}, but the training runtime computes "
                   f"on the {' or '.join(RUNTIME_DEVICES)} only so far (its CUDA path is not in yet); use "
                   "--device cpu")
        elif cfg.task == "link" and device.type not in PAIR_DEVICES:
            err = (f"--device {cfg.device} with --task link: this rank would compute on {device}, but the pair "
                   f"exchange that scores node pairs runs on the {' or '.join(PAIR_DEVICES)} only so far; use "
                   "--device cpu")
    except ConfigError as e:
        err = str(e)
    proto.agree(err, "device")
    return device, direct


def _check_run_dir(proto: Protocol, cfg: TrainConfig) -> None:
    """Step 3: rank 0 checks that the run directory can be made (:func:`~.rundir.check_run_dir`), before any rank
    reads its part."""
    err = None
    if proto.comm.rank == 0:
        try:
            check_run_dir(cfg)
        except ValueError as e:
            err = str(e)
        except OSError as e:   # (a directory that cannot be listed)
            err = f"{e.filename or cfg.out}: cannot be read: {e.strerror or e}"
    proto.agree(err, "run directory")


def _load_part(proto: Protocol, cfg: TrainConfig):
    """Step 3: (part, meta, test hooks) of this rank, agreed on by every rank before any exchange starts."""
    err, part, meta, hooks = None, None, None, None
    try:
        hooks = TestHooks.from_env(proto.comm.rank)
        meta, part = read_rank_part(cfg.parts, proto.comm, cfg.verify)
        # (the same on every rank)
        why = link_misfit(meta, cfg.metric, cfg.decoder) if cfg.task == "link" else label_misfit(cfg.task, part.labels,
                                                                                     part.num_classes)
        err = why and f"{cfg.parts}: {why}"
        sp = None if cfg.model_file else specs.MODELS.get(cfg.model)
        if not err and sp is not None and sp.edge_types and not part.num_relations:
            err = (f"{cfg.parts}: --model {cfg.model} needs edge types and this partition has none (num_relations 0 "
                   "in meta.json): prepare a typed graph (g3-prepare triples, rmat --relations R, write_graph with "
                   "edge_type)")
        if not err and part.feature_dim == 0 and not cfg.node_embedding:
            err = (f"{cfg.parts}: the graph has no node features (feature_dim 0): give the model learned ones with "
                   "--node-embedding DIM")
    except FormatError as e:
        err = str(e)
    except Exception as e:  # noqa: BLE001 - any load failure must reach every rank
        err = f"{type(e).__name__}: {e}"
    if meta is not None:   # the others may still load and plan larger parts: the start-up deadline grows with them
        proto.watchdog.expect_input(largest_part_bytes(meta))
    proto.agree(err, "part files")
    return part, meta, hooks


def _check_halo(proto: Protocol, cfg: TrainConfig, part) -> None:
    """Step 4: halo/send consistency with every neighbour (a pairwise exchange of counts and ID checksums)."""
    comm = proto.comm
    try:
        err = check_neighbours(comm, part, name_of=part_name, watchdog=proto.watchdog)
        err = err and f"{cfg.parts.rstrip('/')}/{part_name(comm.rank)}: {err}"
    except Exception:  # noqa: BLE001 - failed inside its collectives: the others may wait there, so no agree
        proto.abort("checking the halo against the neighbours failed:\n" + traceback.format_exc())
    proto.agree(err, "halo lists")


def _check_held_out(proto: Protocol, cfg: TrainConfig, part) -> None:
    """Step 5 of ``--task link``: no held-out (val, test) pair is an edge of any part's message-passing graph (the
    graph file guarantees it; a part edited since could break it): each pair is looked up on its target's owner."""
    err = None
    try:
        found = first_held_out_edge(proto.watchdog, part)
    except Exception:  # noqa: BLE001 - failed inside its collectives: the others may wait there, so no agree
        proto.abort("checking the held-out pairs against the graph failed:\n" + traceback.format_exc())
    if found is not None:
        (key, _, _, rel, src_orig, dst_orig), src_rank, dst_rank = found
        split, index = HELD_OUT[key >> 40], key & ((1 << 40) - 1)
        err = (f"{cfg.parts.rstrip('/')}/{part_name(src_rank)}: {link_name(split, 'edge')}: pair {index} (node "
               f"{src_orig} -> node {dst_orig}" + (f", relation {rel}" if rel >= 0 else "") + ") is also an edge "
               f"of the message-passing graph (in {part_name(dst_rank)}'s CSR): a held-out edge must not be "
               "trained on (leakage; the part files were changed after g3-partition?)")
    if err:
        proto.same(err, "held-out pairs")


def first_held_out_edge(wd, part):
    """((split number << 40 | position, source, target, relation, original source, original target), the ranks
    owning the source and the target) of the first held-out pair of all ranks that is an edge of the graph, or
    None (:func:`~g3mpi.comm.pairs.first_edge_of_graph`)."""
    rows = []
    for i, s in enumerate(HELD_OUT):
        e = part.links.get(link_name(s, "edge"))
        if e is None or not len(e):
            continue
        t = part.links.get(link_name(s, "edge_type"))
        idx = part.links[link_name(s, "edge_index")]
        rows.append(np.stack([(np.int64(i) << 40) | idx, e[:, 0], e[:, 1],
                              np.full(len(e), -1, np.int64) if t is None else t,
                              np.asarray(part.orig_ids, np.int64)[e[:, 0] - part.owned_start]], axis=1))
    pairs = np.concatenate(rows) if rows else np.zeros((0, 5), dtype=np.int64)
    return first_edge_of_graph(wd, part.owned_start, part.indptr, part.indices, part.halo_ids, part.edge_type,
                               part.orig_ids, pairs)


def _split_sizes(proto: Protocol, cfg: TrainConfig, part) -> dict:
    """Step 5: the split sizes of the whole graph, which has training nodes and every node ID owned once (every
    rank has the same sums, so every rank says the same line and none waits for another)."""
    split_sizes, ids_once = start_up_sums(part, proto.watchdog)
    err = None if ids_once else f"{cfg.parts}: {IDS_NOT_ONCE}"
    if not split_sizes["train"] and cfg.task != "link":  # before the run directory is made: nothing to train on
        # (link trains on pairs, which LinkTask counts: a knowledge graph has no node labels)
        err = err or (f"{cfg.parts}: the graph has no training nodes (no labels, or an empty train mask; "
                      "g3-prepare edgelist takes them with --labels and --masks)")
    if err:
        proto.same(err, "split sizes")
    return split_sizes


def _read_checkpoint(proto: Protocol, cfg: TrainConfig, meta: dict, part, resume: str) -> dict:
    """Step 6 of ``--resume``: RUN/checkpoint.pt, compatible with the settings and the partition."""
    err, ckpt = None, None
    try:
        ckpt = load_checkpoint(f"{resume}/{CHECKPOINT_NAME}")
        check_compatible(f"{resume}/{CHECKPOINT_NAME}", ckpt, cfg, meta,
                         finished=Path(resume, "summary.json").exists(),
                         idle=settings_without_effect(cfg, world_size=proto.comm.size, resuming=True))
        if "shards" in ckpt:    # (node embeddings: this rank's rows and their optimiser state)
            merge_shard(resume, ckpt, proto.comm.rank, proto.comm.size, part.orig_ids, str(meta["partition_id"]))
        elif cfg.node_embedding:
            raise CheckpointError(f"{resume}/{CHECKPOINT_NAME}", "holds no shards of the node embeddings (written "
                                                                 "by an earlier g3mpi): start the run again")
    except CheckpointError as e:
        err = str(e)
    proto.agree(err, "checkpoint")
    return ckpt


def _read_initial(proto: Protocol, cfg: TrainConfig) -> dict:
    """Step 6 of ``--init-from``: the initial parameters."""
    err, init = None, None
    if cfg.node_embedding:
        proto.same(f"{cfg.init_from}: --init-from with --node-embedding is not supported: a run's model.pt holds "
                   "the replicated parameters, not the node embeddings (embeddings.h5)", "initial model")
    try:
        init = load_model_state(cfg.init_from)
    except CheckpointError as e:
        err = str(e)
    proto.agree(err, "initial model")
    return init


def _check_fit(proto: Protocol, cfg: TrainConfig, part, trainer: Trainer, ckpt, init, resume) -> None:
    """Step 7: the checkpoint's states, or the initial parameters (then loaded), fit the trainer's model (every
    rank holds the same ones)."""
    if ckpt is not None:
        err = None
        try:
            check_restorable(f"{resume}/{CHECKPOINT_NAME}", ckpt, trainer.model, trainer.opt)
        except CheckpointError as e:
            err = str(e)
        proto.agree(err, "checkpoint")
    if init is not None:
        why = state_mismatch(init, trainer.model.state_dict())
        err = why and (f"{cfg.init_from}: its parameters do not fit this model ({model_args(cfg)}, "
                       f"{part.feature_dim} features, {part.num_classes} classes): {why}")
        proto.agree(err, "initial model")
        trainer.start_from(init)
