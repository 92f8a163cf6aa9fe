"""Flash checkpoints for PyTorch.

    from goodput.checkpoint import FlashCheckpoint
    ckpt = FlashCheckpoint(job="llm", rank=rank, world_size=world, storage_dir="/ckpt")
    ckpt.save(step, {"model": model.state_dict(), "optim": opt.state_dict(), "rng": torch.get_rng_state()})
    step, state = ckpt.load()          # (None, None) when there is nothing to load

save() copies every tensor into host shared memory (device tensors are copied to the host first)
and returns; that copy is all training waits for. Anything that is not a tensor (ints, floats,
strings, lists, nested dicts) is pickled alongside. load() returns the newest checkpoint that every
rank committed, from shared memory if it is there and intact, else from storage; the tensors it
returns are views of one private, verified copy (no second copy). persist() writes the newest
memory checkpoint to storage; the node agent normally does that in the background.
"""

import pickle
import time
import warnings

import torch

from goodput import _ckpt

CheckpointError = _ckpt.CheckpointError

_SKELETON = "__skeleton__"


class _TensorRef:
    """Stands in for a tensor inside the pickled skeleton."""

    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index

    def __reduce__(self):
        return (_TensorRef, (self.index,))


def _flatten(obj, tensors):
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _TensorRef(len(tensors) - 1)
    if isinstance(obj, dict):
        out = type(obj)()  # keeps OrderedDict (state_dict) an OrderedDict
        for k, v in obj.items():
            out[k] = _flatten(v, tensors)
        return out
    if isinstance(obj, list):
        return [_flatten(v, tensors) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_flatten(v, tensors) for v in obj)
    return obj


def _unflatten(obj, tensors):
    if isinstance(obj, _TensorRef):
        return tensors[obj.index]
    if isinstance(obj, dict):
        out = type(obj)()
        for k, v in obj.items():
            out[k] = _unflatten(v, tensors)
        return out
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_unflatten(v, tensors) for v in obj)
    return obj


def _tensor_paths(obj, path, out):
    """{tensor index: where it sits in the structure} of a flattened state."""
    if isinstance(obj, _TensorRef):
        out[obj.index] = path
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _tensor_paths(v, path + (k,), out)
    elif isinstance(obj, (list, tuple)):
        for k, v in enumerate(obj):
            _tensor_paths(v, path + (k,), out)
    return out


def _dtype(name):
    dtype = getattr(torch, name.rsplit(".", 1)[-1], None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"unknown dtype {name!r} in checkpoint")
    return dtype


class FlashCheckpoint:
    def __init__(self, job, rank=0, world_size=1, storage_dir="", shm_prefix="", keep=3, peers_share_memory=True,
                 memory=True):
        """peers_share_memory=False: ranks live on different hosts; load(step) then trusts that the
        caller agreed on `step` with the other ranks (goodput.live.Session.restore does).
        memory=False: load() reads storage only (another rank's state, saved under an old layout)."""
        self._c = _ckpt.FlashCheckpoint(job, rank, world_size, storage_dir, shm_prefix, keep, peers_share_memory,
                                        memory)
        self.last_save = None
        self.last_load = None

    def save(self, step, state):
        """Copies `state` into shared memory as `step`. Returns {"bytes", "seconds", "object"}."""
        t0 = time.perf_counter()
        tensors = []
        skeleton = pickle.dumps(_flatten(state, tensors), protocol=pickle.HIGHEST_PROTOCOL)
        host = []
        for t in tensors:
            t = t.detach()
            if t.device.type != "cpu":
                t = t.to("cpu")
            host.append(t.contiguous())
        meta = torch.frombuffer(bytearray(skeleton), dtype=torch.uint8) if skeleton else torch.empty(0, dtype=torch.uint8)
        buffers = [(_SKELETON, "bytes", [len(skeleton)], meta.data_ptr(), len(skeleton))]
        for i, t in enumerate(host):
            buffers.append((str(i), str(t.dtype), list(t.shape), t.data_ptr(), t.numel() * t.element_size()))
        stats = self._c.save_raw(int(step), buffers)
        stats["total_seconds"] = time.perf_counter() - t0
        self.last_save = stats
        return stats

    def load(self, step=None, zero_copy=False, into=None):
        """Returns (step, state), or (None, None) when no checkpoint exists. Raises CheckpointError
        when checkpoints exist but none is valid (the message says why each was skipped).

        zero_copy=True: tensors loaded from shared memory are read-only views of it, verified in
        place, with no copy at all; pass them straight to load_state_dict (which copies into the
        model) and drop them before the save after next, which reuses that memory.

        into=state: a state of the same structure as the one saved, whose tensors are filled in
        place (the returned state holds them): {"model": model.state_dict(), "optim": ...}. From
        shared memory each contiguous CPU tensor is read straight into and verified there, so a
        restore costs one pass over memory that is already the model's. If the load fails, or a
        tensor does not match the checkpoint's (CheckpointError), what they hold is undefined."""
        t0 = time.perf_counter()
        targets, dest = [], None
        if into is not None:
            into_skeleton = _flatten(into, targets)
            dest = {str(i): (t.data_ptr(), t.numel() * t.element_size()) for i, t in enumerate(targets)
                    if t.device.type == "cpu" and t.is_contiguous() and t.numel() > 0}
        raw = self._c.load_raw(step, zero_copy, dest)
        if raw is None:
            return None, None
        by_name = {b["name"]: b for b in raw["buffers"]}
        skeleton = pickle.loads(bytes(memoryview(by_name.pop(_SKELETON)["data"])))
        if into is not None:
            want = _tensor_paths(skeleton, (), {})
            have = _tensor_paths(into_skeleton, (), {})
            if want != have:
                raise CheckpointError(f"into: its tensors are not the checkpoint's (the checkpoint has "
                                      f"{len(want)} at {sorted(want.values())[:5]}...; into has {len(have)})")
        tensors = [None] * len(by_name)
        for name, b in by_name.items():
            dtype = _dtype(b["dtype"])
            i = int(name)
            if into is not None:
                t = targets[i]
                if t.dtype != dtype or list(t.shape) != list(b["shape"]):
                    raise CheckpointError(f"into: tensor {want[i]} is {t.dtype} {list(t.shape)}, the checkpoint's "
                                          f"is {dtype} {list(b['shape'])}")
                if not b["placed"] and b["nbytes"] > 0:
                    with torch.no_grad():
                        t.copy_(torch.frombuffer(b["data"], dtype=dtype).view(b["shape"]))
                tensors[i] = t
                continue
            if b["nbytes"] == 0:
                t = torch.empty(b["shape"], dtype=dtype)
            elif memoryview(b["data"]).readonly:
                with warnings.catch_warnings():  # read-only on purpose: see zero_copy above
                    warnings.simplefilter("ignore", UserWarning)
                    t = torch.frombuffer(b["data"], dtype=dtype).view(b["shape"])
            else:
                t = torch.frombuffer(b["data"], dtype=dtype).view(b["shape"])
            tensors[int(name)] = t
        raw["placed"] = sum(1 for b in raw.pop("buffers") if b["placed"])  # read straight into `into`
        raw["total_seconds"] = time.perf_counter() - t0
        self.last_load = raw
        return raw["step"], _unflatten(skeleton, tensors)

    def persist(self):
        """Writes the newest memory checkpoint to storage if storage lacks it (agent side)."""
        return self._c.persist()

    def newest_in_memory(self):
        return self._c.newest_in_memory()

    def memory_steps(self):
        """Steps this rank has committed in shared memory (at most two)."""
        return self._c.memory_steps()

    def complete_storage_steps(self):
        """Steps every rank has in storage."""
        return self._c.complete_storage_steps()

    def storage_steps(self):
        return self._c.storage_steps()

    def remove_memory(self):
        self._c.remove_memory()

    def drop_memory_after(self, step):
        """A restore of `step`: this rank's memory checkpoints of later steps (a history the job
        gave up) are made unloadable. Returns how many."""
        return self._c.drop_memory_after(step)

    def reserve(self, nbytes):
        """Allocates this rank's shared memory for a checkpoint of `nbytes` ahead of the first save
        (agent side; never shrinks it, never changes a checkpoint it holds). Returns the bytes
        allocated, 0 where the file system cannot allocate ahead."""
        return self._c.reserve(int(nbytes))

    def async_persister(self):
        return _ckpt.AsyncPersister(self._c)
