"""Checkpoints: ``RUN/checkpoint.pt``, written atomically by rank 0, read back with ``weights_only=True``.

Parameters and optimiser states are replicated (every rank steps its own optimiser on identical gradients), so
one copy on rank 0 is the whole training state. A checkpoint holds (all plain tensors, numbers and strings):

  ``format``/``version``  ``"g3mpi-checkpoint"``, 1
  ``epoch``               the last completed epoch
  ``model``, ``optimizer`` state_dicts
  ``rng``                 torch's CPU generator state (dropout itself is hashed from (seed, epoch, node ID))
  ``best``                best validation metric so far (``val_acc``): epoch, metrics, model state_dict
  ``since_best``          evaluations without improvement (early stopping)
  ``last_loss``           loss of ``epoch``
  ``config``              the TrainConfig as a dict
  ``partition``           partition_id, num_parts, method, the SHA-256 of every part file and of the graph
                          (from meta.json)

Reading checks the CRC-32 of every record of torch.save's zip archive first (torch.load does not).

Node embeddings (``g3mpi.nn.NodeEmbedding``) are not replicated: each rank holds its owned rows and their optimiser
state. A checkpoint of such a model keeps only the replicated states in ``checkpoint.pt`` and names (``shards``:
``tag``, ``num_parts``) a directory ``checkpoint-shards/TAG/`` where every rank writes ``shard-RRRRR.pt``: its
original node IDs, its rows of each table (now and of the best model) and their optimiser states. The shards of a
new tag are all written before rank 0 replaces ``checkpoint.pt``, and the older tags removed after it, so a crash
leaves the previous complete set or the new one. A resume reads its rank's shard into the checkpoint it loaded
(same partition, same number of ranks).

Writing: a temporary file beside the target, flushed and fsync'ed, renamed over ``checkpoint.pt``, then the
directory fsync'ed: a crash at any moment leaves either the previous checkpoint or the new one, never a mix.
``--resume RUN`` reads it and refuses a checkpoint of a configuration that would train a different model (the
keys of :func:`resume_keys`) or of another partition, unless both partitions split the same graph (their
``meta.json`` ``graph_sha256``, which ``g3-partition`` records): parameters and optimiser states are replicated
and dropout is keyed by original node ID, so the state carries over to any number of ranks.
"""
from __future__ import annotations

import dataclasses
import io
import os
import shutil
import zipfile
from pathlib import Path

import torch

from g3mpi.format import atomic_file
from g3mpi.format.atomic import fsync_path
from g3mpi.format.schema import is_int
from g3mpi.nn import specs

from .choices import SUFFIX

CHECKPOINT_NAME = "checkpoint.pt"
#: the directory of the per-rank shards of the sharded parameters (node embeddings), one subdirectory per checkpoint
SHARDS_DIR = "checkpoint-shards"
SHARD_FORMAT = "g3mpi-checkpoint-shard"
CHECKPOINT_FORMAT = "g3mpi-checkpoint"
CHECKPOINT_VERSION = 1
#: settings a resumed run must share with its checkpoint besides the models' own (:func:`resume_keys`)
RUN_RESUME_KEYS = ("model", "model_file", "node_embedding", "layers", "hidden", "dropout", "activation", "residual",
                   "norm", "input_linear", "output_linear", "ffn", "jk", "optimizer", "lr", "weight_decay",
                   "momentum", "seed", "task", "metric", "decoder", "embed_dim", "negatives")


def resume_keys() -> tuple:
    """The settings a resumed run must share with its checkpoint: :data:`RUN_RESUME_KEYS` and every model setting of
    the registry (``specs.SETTINGS``, read now: a model's entry brings its own). The rest (epochs, threads,
    schedule, ...) may change; so may those of these that have no effect on the run (heads for GCN, momentum with
    Adam), with a warning."""
    return RUN_RESUME_KEYS + tuple(specs.SETTINGS)


class CheckpointError(Exception):
    """A checkpoint that is missing, unreadable or does not belong to this run (the message names the file)."""

    def __init__(self, path, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


def partition_fingerprint(meta: dict) -> dict:
    """What a checkpoint records of its partition: the partition's identity and files, and the graph's content
    (``graph_sha256``, None for partitions made before it was recorded, or not by ``g3-partition``)."""
    graph = meta.get("graph_sha256")
    return dict(partition_id=str(meta["partition_id"]), num_parts=int(meta["num_parts"]),
                method=str(meta.get("method", "")), files={k: str(v) for k, v in sorted(meta["files"].items())},
                graph=graph if isinstance(graph, str) else None)


def other_graph(saved: dict, now: dict, parts: str) -> str | None:
    """Why two partition fingerprints are not known to split the same graph, or None if they are (both must
    record their graph)."""
    if not saved.get("graph"):
        return ("the checkpoint's partition does not record its graph (no graph_sha256: made before g3mpi recorded "
                "it, or not by g3-partition)")
    if not now.get("graph"):
        return (f"{parts}/meta.json has no graph_sha256 (made before g3mpi recorded it, or not by g3-partition), "
                "so it is not known to split the same graph")
    if saved["graph"] != now["graph"]:
        return "it splits another graph (graph_sha256 differs)"
    return None


def _clone(state: dict) -> dict:
    return {k: (v.detach().cpu().clone() if torch.is_tensor(v) else v) for k, v in state.items()}


def make_checkpoint(*, epoch: int, model: dict, optimizer: dict, best: dict, since_best: int, last_loss,
                    cfg, meta: dict, shards: dict | None = None) -> dict:
    """The checkpoint of a run at ``epoch``; ``best``: its model selection (``score``: the best validation value of
    ``cfg.metric``, ``epoch``, ``accs``, ``state``); ``shards``: ``tag`` and ``num_parts`` of the per-rank shards
    of its sharded parameters, if it has any."""
    extra = {} if shards is None else dict(shards=dict(tag=str(shards["tag"]), num_parts=int(shards["num_parts"])))
    return dict(**extra, format=CHECKPOINT_FORMAT, version=CHECKPOINT_VERSION, epoch=int(epoch), model=_clone(model),
                optimizer=optimizer, rng=torch.get_rng_state(),
                # val_acc: the best validation value of the selection metric (the name kept since accuracy)
                best=dict(val_acc=float(best["score"]), epoch=int(best["epoch"]),
                          accs={k: float(v) for k, v in best["accs"].items()},
                          state=_clone(best["state"]) if best["state"] is not None else None),
                since_best=int(since_best), last_loss=None if last_loss is None else float(last_loss),
                config=dataclasses.asdict(cfg), partition=partition_fingerprint(meta))


def shard_path(run_dir, tag: str, rank: int) -> Path:
    """RUN/checkpoint-shards/TAG/shard-RRRRR.pt: rank ``rank``'s shard of the checkpoint ``tag``."""
    return Path(run_dir) / SHARDS_DIR / tag / f"shard-{rank:05d}.pt"


def split_shard(model: dict, optimizer: dict, best_state: dict | None, sharded: dict[str, int]):
    """(model, optimizer, best state) without the sharded parameters (``sharded``: name -> index among the
    optimiser's parameters), and this rank's shard of them: ``model``, ``best`` (rows by name), ``optimizer``
    (states by index)."""
    shard = dict(model={k: model[k] for k in sharded},
                 best=None if best_state is None else {k: best_state[k] for k in sharded},
                 optimizer={i: optimizer["state"][i] for i in sharded.values() if i in optimizer["state"]})
    keep = dict(optimizer, state={i: v for i, v in optimizer["state"].items() if i not in shard["optimizer"]})
    rest = {k: v for k, v in model.items() if k not in sharded}
    best = None if best_state is None else {k: v for k, v in best_state.items() if k not in sharded}
    return rest, keep, best, shard


def save_shard(path, rank: int, orig_ids, shard: dict) -> None:
    """Atomically write rank ``rank``'s shard (:func:`split_shard`) with its original node IDs."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_torch(path, dict(format=SHARD_FORMAT, version=CHECKPOINT_VERSION, rank=int(rank),
                           orig_ids=torch.as_tensor(orig_ids, dtype=torch.int64).clone(),
                           model=_clone(shard["model"]), best=None if shard["best"] is None else _clone(shard["best"]),
                           optimizer={i: _clone(st) for i, st in shard["optimizer"].items()}))


def merge_shard(run_dir, ckpt: dict, rank: int, size: int, orig_ids, partition_id: str) -> None:
    """Put rank ``rank``'s shard of ``ckpt`` (one with ``shards``) back into it: the table rows into ``model`` and
    ``best.state``, their optimiser states into ``optimizer``. CheckpointError naming the file when the shard is
    missing, damaged, of another rank's nodes, or the run now has another partition or number of ranks."""
    sh = ckpt["shards"]
    path = shard_path(run_dir, sh["tag"], rank)
    if sh["num_parts"] != size or ckpt["partition"]["partition_id"] != partition_id:
        raise CheckpointError(path.parent, f"the node embeddings are held by the {sh['num_parts']} ranks of "
                                           f"partition {ckpt['partition']['partition_id']}: resume on that "
                                           f"partition with {sh['num_parts']} ranks")
    if not path.is_file():
        raise CheckpointError(path, "this rank's shard of the checkpoint is missing")
    shard = _load_verified(path, "checkpoint shard")
    ok = (isinstance(shard, dict) and shard.get("format") == SHARD_FORMAT and shard.get("rank") == rank
          and torch.is_tensor(shard.get("orig_ids")) and isinstance(shard.get("model"), dict)
          and isinstance(shard.get("optimizer"), dict)
          and (shard.get("best") is None or isinstance(shard["best"], dict)))
    if not ok:
        raise CheckpointError(path, f"not a g3mpi checkpoint shard of rank {rank}")
    if not torch.equal(shard["orig_ids"], torch.as_tensor(orig_ids, dtype=torch.int64)):
        raise CheckpointError(path, f"holds other nodes than rank {rank}'s part")
    ckpt["model"].update(shard["model"])
    if ckpt["best"]["state"] is not None:
        if shard["best"] is None:
            raise CheckpointError(path, "lacks the best model's rows")
        ckpt["best"]["state"].update(shard["best"])
    ckpt["optimizer"]["state"].update(shard["optimizer"])


def prune_shards(run_dir, keep: str | None) -> None:
    """Remove the shard directories of RUN other than ``keep`` (None: all): those of older checkpoints."""
    root = Path(run_dir) / SHARDS_DIR
    if not root.is_dir():
        return
    for d in root.iterdir():
        if d.name != keep:
            shutil.rmtree(d, ignore_errors=True)
    if keep is None:
        shutil.rmtree(root, ignore_errors=True)


def write_torch(path, obj) -> None:
    """Atomically replace ``path`` with torch.save's archive of ``obj`` (temporary file, fsync, rename, fsync of
    the directory). The archive is made in memory and written with a plain file write, so a write that fails (a
    full disk) raises the system's OSError ("No space left on device") instead of torch's RuntimeError about its
    stream ("unexpected pos 704 vs 598")."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    path = Path(path)
    with atomic_file(path, force=True) as tmp:
        with open(tmp, "wb") as f:
            f.write(buf.getbuffer())
            f.flush()
            os.fsync(f.fileno())
    fsync_path(path.parent)


def save_checkpoint(path, ckpt: dict) -> None:
    """Atomically replace ``path`` with ``ckpt`` (:func:`write_torch`)."""
    write_torch(path, ckpt)


def _load_verified(path: Path, what: str):
    """``torch.load(path, weights_only=True)`` (no unpickling of arbitrary objects) after checking the CRC-32 of
    every record of torch.save's zip archive, which torch.load does not: a flipped byte in a tensor (a parameter,
    an Adam state) would load silently. CheckpointError naming the file if either fails (``what``: "checkpoint",
    "model file")."""
    try:
        with zipfile.ZipFile(path) as z:
            damaged = z.testzip()
        obj = None if damaged else torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise CheckpointError(path, f"not a readable {what} (truncated or corrupt?): {type(e).__name__}: "
                                    f"{str(e).splitlines()[0] if str(e) else ''}") from None
    if damaged:
        raise CheckpointError(path, f"checksum mismatch in record {damaged!r} (file corrupt)")
    return obj


def load_checkpoint(path) -> dict:
    """Read a checkpoint (:func:`_load_verified`) and check its layout."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "no such checkpoint (was the run started with this g3mpi?)")
    ckpt = _load_verified(path, "checkpoint")
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        found = ckpt.get("format") if isinstance(ckpt, dict) else None
        raise CheckpointError(path, f"not a g3mpi checkpoint (format {found!r})")
    if not is_int(ckpt.get("version")) or ckpt["version"] != CHECKPOINT_VERSION:
        raise CheckpointError(path, f"checkpoint version {ckpt.get('version')!r:.40} is not supported "
                                    f"(this g3mpi reads version {CHECKPOINT_VERSION})")
    for k in ("epoch", "model", "optimizer", "rng", "best", "since_best", "config", "partition"):
        if k not in ckpt:
            raise CheckpointError(path, f"key {k!r} is missing")
    _check_layout(path, ckpt)
    return ckpt


def load_model_state(path) -> dict:
    """The parameters a run starts from (``--init-from``): a plain state_dict such as a run's ``model.pt``, read
    by :func:`_load_verified`; every value a finite floating-point tensor. CheckpointError (naming the file)
    otherwise; a g3mpi checkpoint is refused with a pointer to ``--resume`` or its run's model.pt."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(path, "no such model file (--init-from takes a run's model.pt)")
    if not path.is_file():   # (a FIFO would block the read)
        raise CheckpointError(path, f"is a {'directory' if path.is_dir() else 'special file'}, not a model file "
                                    "(--init-from takes a run's model.pt)")
    state = _load_verified(path, "model file")
    if isinstance(state, dict) and state.get("format") == CHECKPOINT_FORMAT:
        raise CheckpointError(path, "is a g3mpi checkpoint: continue its run with --resume RUN, or start from the "
                                    "run's model.pt")
    if not isinstance(state, dict) or not state or not all(isinstance(k, str) and torch.is_tensor(v)
                                                          for k, v in state.items()):
        raise CheckpointError(path, "not a model state_dict (expected parameter names mapped to tensors, as in a "
                                    "run's model.pt)")
    why = unusable_values(state)
    if why:
        raise CheckpointError(path, why)
    return state


def unusable_values(state: dict) -> str | None:
    """Why the tensors of the state_dict ``state`` cannot be parameters to train from (the first one not floating
    point or not finite; BatchNorm's step counter ``num_batches_tracked`` is a non-negative integer), or None."""
    for k, v in state.items():
        if k.endswith("num_batches_tracked") and v.dtype == torch.int64 and v.dim() == 0:
            if int(v) < 0:
                return f"buffer {k!r} is negative ({int(v)})"
            continue
        if not v.is_floating_point():
            return f"parameter {k!r} is a {v.dtype} tensor, not floating point"
        if not bool(torch.isfinite(v).all()):
            return f"parameter {k!r} has non-finite values (NaN or infinity)"
    return None


def state_mismatch(given: dict, expected: dict) -> str | None:
    """Why the parameters ``given`` cannot be loaded into a model whose state_dict is ``expected`` (names and
    shapes), or None if they can."""
    missing = [k for k in expected if k not in given]
    extra = [k for k in given if k not in expected]
    shapes = [f"{k} is {tuple(given[k].shape)}, the model's {tuple(expected[k].shape)}"
              for k in expected if k in given and given[k].shape != expected[k].shape]
    why = []
    if missing:
        why.append(f"missing {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    if extra:
        why.append(f"not in the model {', '.join(extra[:4])}{' ...' if len(extra) > 4 else ''}")
    if shapes:
        why.append("; ".join(shapes[:4]) + (" ..." if len(shapes) > 4 else ""))
    return "; ".join(why) or None


def _optimizer_mismatch(saved: dict, opt) -> str | None:
    """Why the optimiser state ``saved`` cannot continue ``opt`` (parameter groups and the shapes of the
    per-parameter states; ``load_state_dict`` checks the counts, not the shapes, which failed at the first step),
    or None."""
    groups, state = saved.get("param_groups"), saved.get("state")
    if not isinstance(groups, list) or not isinstance(state, dict):
        return "its optimizer state lacks param_groups or state"
    if len(groups) != len(opt.param_groups) or not all(
            isinstance(g, dict) and isinstance(g.get("params"), list) and len(g["params"]) == len(o["params"])
            for g, o in zip(groups, opt.param_groups)):
        return "its optimizer state has other parameter groups than this model"
    params = {pid: p for g, o in zip(groups, opt.param_groups) for pid, p in zip(g["params"], o["params"])}
    for pid, st in state.items():
        if pid not in params or not isinstance(st, dict):
            return f"its optimizer state holds an unknown parameter {pid!r}"
        for k, v in st.items():
            if k == "step":
                if not (isinstance(v, (int, float)) or torch.is_tensor(v) and v.numel() == 1) \
                        or not float(v) >= 0 or not float(v) < float("inf"):
                    return f"its optimizer step of parameter {pid} is not a finite non-negative number"
            elif torch.is_tensor(v) and v.shape != params[pid].shape:
                return (f"its optimizer state {k!r} of parameter {pid} is {tuple(v.shape)}, the parameter's "
                        f"{tuple(params[pid].shape)}")
    return None


def check_restorable(path, ckpt: dict, model, optimizer) -> None:
    """Refuse (CheckpointError naming ``path``) a checkpoint whose states do not fit the model and optimiser
    built from its configuration: parameter names and shapes (also of the best model; finite floating point, as
    ``load_model_state`` wants for --init-from), the optimiser's
    parameter groups and state shapes, torch's RNG state. A file of allowed types and layout may still hold
    tensors of other shapes; ``Trainer.restore`` (or the first step, or writing model.pt at the end) then failed
    with a traceback."""
    want = model.state_dict()
    for what, state in (("model", ckpt["model"]), ("best model", ckpt["best"].get("state"))):
        if state is None:
            continue
        why = state_mismatch(state, want)
        if why:
            raise CheckpointError(path, f"its {what} does not fit the configured one: {why}")
        why = unusable_values(state)
        if why:
            raise CheckpointError(path, f"its {what}'s {why}")
    why = _optimizer_mismatch(ckpt["optimizer"], optimizer)
    if why:
        raise CheckpointError(path, why)
    if ckpt["rng"].shape != torch.get_rng_state().shape:
        raise CheckpointError(path, f"its rng state has {ckpt['rng'].numel()} bytes, torch's "
                                    f"{torch.get_rng_state().numel()}")


#: the keys of a checkpoint's ``best.accs`` (``Trainer.evaluate``'s metrics; none before the first evaluation)
ACC_KEYS = tuple(f"{s}_{m}" for m in SUFFIX.values() for s in ("train", "val", "test"))


def _check_layout(path, ckpt: dict) -> None:
    """The types :func:`check_compatible` and ``Trainer.restore`` rely on (a file that loads with
    ``weights_only=True`` may still hold anything of the allowed types)."""
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise CheckpointError(path, f"malformed checkpoint: {what}")

    def state_dict(x) -> bool:
        return isinstance(x, dict) and all(isinstance(k, str) and torch.is_tensor(v) for k, v in x.items())

    need(is_int(ckpt["epoch"]) and ckpt["epoch"] >= 0, "epoch must be a non-negative integer")
    need(is_int(ckpt["since_best"]) and ckpt["since_best"] >= 0, "since_best must be a non-negative integer")
    need(state_dict(ckpt["model"]), "model must map parameter names to tensors")
    need(isinstance(ckpt["optimizer"], dict), "optimizer must be a state_dict")
    need(torch.is_tensor(ckpt["rng"]) and ckpt["rng"].dtype == torch.uint8, "rng must be a uint8 tensor")
    need(ckpt.get("last_loss") is None or isinstance(ckpt["last_loss"], float), "last_loss must be a number")
    need(isinstance(ckpt["config"], dict) and all(isinstance(k, str) for k in ckpt["config"]),
         "config must be a dict of settings")
    every = ckpt["config"].get("eval_every")   # (the resume computes with it: metrics.jsonl is cut on its grid)
    need(every is None or is_int(every) and every >= 1, "config's eval_every must be a positive integer")
    part = ckpt["partition"]
    need(isinstance(part, dict) and isinstance(part.get("partition_id"), str) and is_int(part.get("num_parts"))
         and isinstance(part.get("method"), str) and isinstance(part.get("files"), dict)
         and (part.get("graph") is None or isinstance(part.get("graph"), str)),
         "partition must hold partition_id, num_parts, method, files and graph (a string or nothing)")
    sh = ckpt.get("shards")
    need(sh is None or isinstance(sh, dict) and isinstance(sh.get("tag"), str) and sh["tag"].isalnum()
         and is_int(sh.get("num_parts")) and sh["num_parts"] >= 1, "shards must hold a tag and num_parts")
    best = ckpt["best"]
    need(isinstance(best, dict) and isinstance(best.get("val_acc"), float) and is_int(best.get("epoch"))
         and isinstance(best.get("accs"), dict) and (best.get("state") is None or state_dict(best.get("state"))),
         "best must hold val_acc, epoch, accs and state")
    # (the resume reports them in summary.json and writes them into its next checkpoint as floats)
    need(all(k in ACC_KEYS and isinstance(v, float) for k, v in best["accs"].items()),
         f"best's accs must map {', '.join(ACC_KEYS)} to numbers")


def check_compatible(path, ckpt: dict, cfg, meta: dict, finished: bool = False, idle=()) -> None:
    """Refuse to resume from a checkpoint of another partition or of an incompatible configuration (a setting of
    :func:`resume_keys` that differs, naming each; not one in ``idle``, the settings without effect on this run,
    ``config.settings_without_effect``, which g3-train warns about as on any run), or, when the run ``finished``
    (its summary.json exists), from its last checkpoint with nothing left to train. A run whose last checkpoint
    was written but whose outputs were not (a full disk, a kill) may resume: it only writes them."""
    saved, now = ckpt["partition"], partition_fingerprint(meta)
    if saved["partition_id"] != now["partition_id"]:
        why = other_graph(saved, now, cfg.parts)
        if why:
            raise CheckpointError(path, f"was written for partition {saved['partition_id']} ({saved['method']}, "
                                        f"{saved['num_parts']} parts), not for {cfg.parts} (partition "
                                        f"{now['partition_id']}), and {why}; resume with the partition it was "
                                        "trained on, or with one g3-partition made from the same graph file")
    elif saved["files"] != now["files"]:
        changed = sorted(k for k in set(saved["files"]) | set(now["files"])
                         if saved["files"].get(k) != now["files"].get(k))
        raise CheckpointError(path, f"the partition's files changed since the checkpoint: {', '.join(changed)}")
    # a key the checkpoint lacks (written before the setting existed) had its default
    was = {f.name: ckpt["config"].get(f.name, f.default) for f in dataclasses.fields(cfg)}
    diffs = [f"{k} = {was[k]!r} in the checkpoint but {getattr(cfg, k)!r} now"
             for k in resume_keys() if was[k] != getattr(cfg, k) and k not in idle]
    if diffs:
        raise CheckpointError(path, "incompatible configuration: " + "; ".join(diffs))
    if cfg.epochs < ckpt["epoch"]:
        raise CheckpointError(path, f"already at epoch {ckpt['epoch']}, beyond --epochs {cfg.epochs}")
    if not finished:
        return
    if cfg.epochs == ckpt["epoch"]:
        raise CheckpointError(path, f"already at epoch {ckpt['epoch']}: nothing to train with --epochs {cfg.epochs} "
                                    "(give more epochs to continue)")
    if cfg.patience and ckpt["since_best"] >= cfg.patience:
        raise CheckpointError(path, f"the run stopped early at epoch {ckpt['epoch']} (no better validation "
                                    f"{cfg.metric} in {ckpt['since_best']} evaluations, --patience {cfg.patience}): "
                                    "nothing to resume (a larger --patience continues it)")
