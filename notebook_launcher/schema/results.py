"""A rank's return value on its way to the kernel, with its tensors' bytes copied as few times as possible.

The value is pickled (cloudpickle) with every CPU tensor storage taken out of the pickle: the ``result`` event's
attachment is the pickle followed by the raw bytes of each storage, written straight from the tensors' memory.
The kernel reads each storage's bytes from the pipe into a storage of its own (``result_sinks``), so a returned
1 GB state_dict costs the kernel about 1 GB, not the three copies a plain pickle takes (the pickle, torch's own
byte copy inside it, then the tensor). A result of a rank on the kernel's machine, from ``IN_MEMORY_FROM``
bytes, skips the pipe: the rank writes the same parts into an in-memory file the kernel maps
(``result_memory.py``).

Which results travel: rank 0's always; another rank's only when ``results="all"``, or with the default
``results="auto"`` when it is at most ``SMALL_RESULT_BYTES``; ``results="rank0"`` sends none but rank 0's. A
result left out says so in its event (``kept: False``) and in ``Run.results_left_out``.

Both sides use this module: it knows the event schema's ``result`` data and nothing of the launcher.
"""

from __future__ import annotations

import ctypes
import io
import pickle
import sys

from .result_memory import MappedResult

RESULT_CHOICES = ("auto", "all", "rank0")
SMALL_RESULT_BYTES = 64 * 2**20


class ResultParts:
    """The attachment of a result as the kernel received it: the pickle, then one storage per tensor storage.

    Each part is made when its first byte arrives (``part``), not when the header announces it: a header that
    claims gigabytes and sends nothing behind it costs the kernel nothing."""

    def __init__(self, pickle_bytes: int, sizes: list):
        self.pickled: bytearray | None = None
        self.storages: list = [None] * len(sizes)
        self._sizes = sizes
        self._pickle_bytes = pickle_bytes

    def part(self, index: int) -> memoryview:
        """For ``FrameDecoder``: the buffer of part ``index`` (0: the pickle, then each storage), made now."""
        if index == 0:
            self.pickled = bytearray(self._pickle_bytes)
            return memoryview(self.pickled)
        import torch

        storage = self.storages[index - 1] = torch.UntypedStorage(self._sizes[index - 1])
        return _bytes_of(storage)

    def __len__(self) -> int:
        return len(self.pickled) + sum(storage.nbytes() for storage in self.storages)

    def __bytes__(self) -> bytes:  # an agent forwards the result to the launching kernel as one attachment
        return bytes(self.pickled) + b"".join(bytes(_bytes_of(storage)) for storage in self.storages)


# -- worker side --------------------------------------------------------------------------------------------------
def pack_result(value, rank: int, results: str) -> tuple[dict, list]:
    """The ``result`` event's data and the attachment's parts (buffers to write in order)."""
    kind = type(value).__name__
    if rank != 0 and results == "rank0":
        return {"type": kind, "kept": False, "reason": "results='rank0'"}, []
    storages: list = []
    pickled = io.BytesIO()
    try:
        _storage_pickler()(pickled, storages).dump(value)
    except Exception as exc:  # noqa: BLE001
        raise TypeError(
            f"the function's return value (a {kind}) could not be pickled to send it to the kernel: {exc}. Return "
            f"plain data (tensors, numbers, dicts, a state_dict) instead.") from exc
    parts = [pickled.getbuffer()] + [_bytes_of(storage) for storage in storages]
    size = sum(part.nbytes for part in parts)
    if rank != 0 and results == "auto" and size > SMALL_RESULT_BYTES:
        return {"type": kind, "bytes": size, "kept": False, "reason": f"larger than {SMALL_RESULT_BYTES >> 20} MB "
                f"(results='all' brings it back)"}, []
    return {"type": kind, "bytes": size, "attachment_bytes": size, "pickle_bytes": parts[0].nbytes,
            "storages": [storage.nbytes() for storage in storages]}, parts



def _storage_pickler():
    """cloudpickle's Pickler, with each CPU tensor storage replaced by its index in ``storages`` (sent out of
    band). Made on first use, so importing this module does not import cloudpickle."""
    global _StoragePickler
    if _StoragePickler is None:
        import cloudpickle

        class StoragePickler(cloudpickle.Pickler):
            def __init__(self, file, storages: list):
                super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
                self._storages = storages
                self._index: dict = {}

            def persistent_id(self, obj):  # (called for every object pickled: most are not storages)
                storage = _storage_kinds.get(type(obj))
                if storage is None:
                    storage = _storage_kinds[type(obj)] = _is_storage_kind(type(obj))
                return _storage_id(obj, self._storages, self._index) if storage else None

            def reducer_override(self, obj):
                if _kernel_main and _in_kernel_main(obj):
                    return NotImplemented  # by reference: the kernel's unpickling finds its own class
                return super().reducer_override(obj)

        _StoragePickler = StoragePickler
    return _StoragePickler


_StoragePickler = None
_storage_kinds: dict = {}  # type -> whether it is a torch storage's
_kernel_main: dict = {}  # a forked rank: the names of the kernel's __main__ (the notebook's) as it forked


def inherit_kernel_main() -> None:
    """In a rank forked from the kernel: its ``__main__`` is the notebook's, inherited. A class (or function) of
    it in the result is then pickled by reference, as ``__main__.Name``, so the kernel unpickles it as its own
    class (``isinstance`` and ``==`` hold); cloudpickle would pickle it by value, as a new class. (Under spawn,
    cloudpickle's own tracking of the classes the kernel sent by value does the same.)"""
    main = sys.modules.get("__main__")
    _kernel_main.clear()
    if main is not None:
        _kernel_main.update(vars(main))


def _in_kernel_main(obj) -> bool:
    """``obj`` is a class or function of the notebook as the kernel has it: the same object, under its name, in
    the kernel's __main__ at the fork and in this rank's __main__ now."""
    if not isinstance(obj, type) and type(obj).__name__ != "function":
        return False
    if getattr(obj, "__module__", None) != "__main__" or "<locals>" in getattr(obj, "__qualname__", "<locals>"):
        return False
    first, *rest = obj.__qualname__.split(".")
    inherited, now = _kernel_main.get(first), getattr(sys.modules.get("__main__"), first, None)
    for name in rest:
        inherited, now = getattr(inherited, name, None), getattr(now, name, None)
    return inherited is obj and now is obj


def prepare() -> None:
    """Before forking workers: cloudpickle imported and the pickler made once, in the kernel, not in every rank
    (about 2 ms per rank and launch otherwise)."""
    _storage_pickler()


def _is_storage_kind(kind: type) -> bool:
    torch = sys.modules.get("torch")  # (no storage exists before torch is imported)
    return torch is not None and issubclass(kind, (torch.storage.TypedStorage, torch.UntypedStorage))


def _storage_id(obj, storages: list, index: dict):
    """A storage's persistent id (its index in ``storages``, and its dtype if typed), or None if not sent apart."""
    typed = isinstance(obj, sys.modules["torch"].storage.TypedStorage)
    untyped = obj._untyped_storage if typed else obj
    if untyped.device.type != "cpu" or untyped.nbytes() == 0:
        return None
    key = untyped._cdata  # views of one storage share it, as they did in the worker
    if key not in index:
        index[key] = len(storages)
        storages.append(untyped)
    return ("storage", index[key], str(obj.dtype).removeprefix("torch.") if typed else None)


def _bytes_of(storage) -> memoryview:
    """A writable byte view of a CPU storage's memory (no copy) that keeps the storage alive as long as the view
    lives: a tensor copied off a GPU or TPU (``.cpu()``) is referenced by nothing else once the result is packed,
    and its memory would be freed and reused before the frame is written."""
    window = (ctypes.c_ubyte * storage.nbytes()).from_address(storage.data_ptr())
    window.owner = storage  # the view holds the window, the window holds the storage
    return memoryview(window).cast("B")


# -- kernel side --------------------------------------------------------------------------------------------------
def result_sinks(header: dict, length: int):
    """For ``FrameDecoder``: where a result's attachment is read to, once: the pickle and each storage, each
    allocated as its first byte arrives (the parts are given as their sizes; ``ResultParts.part`` makes them)."""
    _check_room(length)
    data = header["data"]
    sizes, pickled = data.get("storages"), data.get("pickle_bytes")  # (checked by the decoder: they add up)
    if not sizes:
        buffer = bytearray(length)  # one pickle, no storage beside it
        return buffer, [memoryview(buffer)]
    return ResultParts(pickled, list(sizes)), [pickled, *sizes]


def unpack_result(data: dict, attachment):
    """The rank's return value from its ``result`` event (raises what unpickling raises)."""
    if data.get("in_memory") and not isinstance(attachment, MappedResult):
        attachment = MappedResult([])  # (no file was given to the rank: a hostile or confused event)
    if isinstance(attachment, MappedResult):  # written in memory by the rank (result_memory.py)
        pickled, storages = attachment.read(data["pickle_bytes"], data["storages"], data.get("phases"))
        return _StorageUnpickler(io.BytesIO(pickled), storages).load()
    if isinstance(attachment, ResultParts):
        return _StorageUnpickler(io.BytesIO(attachment.pickled), attachment.storages).load()
    if not data.get("storages"):
        return pickle.loads(attachment)
    import torch

    if isinstance(attachment, bytes):
        attachment = bytearray(attachment)  # tensors need writable memory
    view = memoryview(attachment)
    offset = data["pickle_bytes"]
    storages = []
    for size in data["storages"]:  # zero-copy views of the one buffer (kept alive by the storages)
        storages.append(torch.frombuffer(view, dtype=torch.uint8, offset=offset, count=size).untyped_storage())
        offset += size
    return _StorageUnpickler(io.BytesIO(view[:data["pickle_bytes"]]), storages).load()


def _check_room(length: int) -> None:
    """The bound of a result: the memory this machine has available when its header arrives (``MemAvailable``);
    a larger one is refused before anything is allocated (a frame of a few bytes can announce gigabytes)."""
    if length < SMALL_RESULT_BYTES:
        return
    try:
        with open("/proc/meminfo") as meminfo:
            available = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return
    if length > available:
        raise MemoryError(f"a result of {length / 2**30:.1f} GiB, with {available / 2**30:.1f} GiB available here")


_REBUILDS = ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_qtensor")  # (storage, offset, size, stride, ...)


def _checked_rebuild(rebuild):
    """torch's rebuild of a tensor from its storage, after checking that the storage holds every element the
    pickle's size, stride and offset ask of it (torch does not check: a tensor over a storage too small for it
    reads memory that is not its own)."""
    def checked(storage, storage_offset, size, stride, *rest):
        _check_extent(storage, storage_offset, size, stride)
        return rebuild(storage, storage_offset, size, stride, *rest)

    return checked


def _check_extent(storage, offset, size, stride) -> None:
    import torch

    if not isinstance(storage, (torch.storage.TypedStorage, torch.UntypedStorage)):
        raise pickle.UnpicklingError(f"a tensor whose storage is a {type(storage).__name__}")
    dims = (*size, *stride, offset)
    if len(size) != len(stride) or not all(isinstance(dim, int) and dim >= 0 for dim in dims):
        raise pickle.UnpicklingError(f"a tensor of shape {tuple(size)!r}, strides {tuple(stride)!r} and offset "
                                     f"{offset!r}, which no storage holds")
    typed = isinstance(storage, torch.storage.TypedStorage)
    element = storage.dtype.itemsize if typed else 1
    held = (storage._untyped_storage if typed else storage).nbytes()
    needed = 0 if 0 in size else (offset + sum((dim - 1) * step for dim, step in zip(size, stride)) + 1) * element
    if needed > held:
        raise pickle.UnpicklingError(
            f"a tensor of shape {tuple(size)} ({element}-byte elements, strides {tuple(stride)}, offset {offset}) "
            f"needs {needed} bytes of its storage, which holds {held}")


class _StorageUnpickler(pickle.Unpickler):
    def __init__(self, file, storages: list):
        super().__init__(file)
        self._storages = storages

    def find_class(self, module: str, name: str):
        found = super().find_class(module, name)
        return _checked_rebuild(found) if module == "torch._utils" and name in _REBUILDS else found

    def persistent_load(self, pid):
        import torch

        tag, index, dtype = pid
        if tag != "storage" or not isinstance(index, int) or not 0 <= index < len(self._storages):
            raise pickle.UnpicklingError(f"an unknown reference in the result: {pid!r}")
        storage = self._storages[index]
        if dtype is None:
            return storage
        return torch.storage.TypedStorage(wrap_storage=storage, dtype=getattr(torch, dtype), _internal=True)
