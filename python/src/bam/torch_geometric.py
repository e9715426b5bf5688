# SPDX-License-Identifier: MIT
"""A PyTorch Geometric feature store over :class:`bam.Array` tables.

    from bam.torch_geometric import FeatureStore
    store = FeatureStore()
    store.add(bam.Array(cache, s, (nodes, dim), "float32"), group_name="paper", attr_name="x")
    x = store["paper", "x", idx]          # rows gathered through the page cache

``put_tensor`` of a whole tensor places it on the storage given to the
constructor (after the arrays already there) and writes it through the cache.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

try:
    import torch
    from torch_geometric.data import FeatureStore as _PygFeatureStore
    from torch_geometric.data import TensorAttr
except ImportError as e:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "bam.torch_geometric needs torch and torch_geometric (pip install torch torch_geometric)"
    ) from e

import bam

_Key = Tuple[Optional[str], Optional[str]]

#: Rows written per step when a whole tensor is put into the store.
_PUT_CHUNK_BYTES = 64 << 20


class FeatureStore(_PygFeatureStore):
    """Node (or edge) feature tables in :class:`bam.Array`s, keyed by
    ``(group_name, attr_name)``. ``cache`` and ``storage`` are needed only to
    put whole new tensors; arrays made elsewhere are added with :meth:`add`."""

    def __init__(
        self,
        cache: Optional[bam.PageCache] = None,
        storage: Optional[bam.StorageLike] = None,
        offset: int = 0,
    ) -> None:
        super().__init__()
        self._arrays: Dict[_Key, bam.Array] = {}
        self._cache = cache
        self._storage = bam._storage(storage) if storage is not None else None
        self._next_offset = offset

    @staticmethod
    def _key(attr: TensorAttr) -> _Key:
        return (attr.group_name, attr.attr_name)

    def add(self, array: bam.Array, group_name: Optional[str] = None, attr_name: Optional[str] = None) -> None:
        """Serve ``array`` as ``(group_name, attr_name)``."""
        if not isinstance(array, bam.Array):
            raise TypeError(f"FeatureStore.add: expected a bam.Array, got {type(array).__name__}")
        self._arrays[(group_name, attr_name)] = array
        if array.storage is self._storage:
            end = array.offset + array.rows * array.row_width * array.element_size
            self._next_offset = max(self._next_offset, end)

    def _rows(self, array: bam.Array, index: Any) -> torch.Tensor:
        """``index`` (None, a slice, a tensor or array of ids) as a CUDA int64 tensor."""
        device = torch.device("cuda", torch.cuda.current_device())
        if index is None:
            return torch.arange(array.rows, dtype=torch.int64, device=device)
        if isinstance(index, slice):
            return torch.arange(*index.indices(array.rows), dtype=torch.int64, device=device)
        ids = torch.as_tensor(index)
        if ids.dtype == torch.bool:
            ids = ids.nonzero().reshape(-1)
        return ids.to(device=device, dtype=torch.int64).reshape(-1)

    def _put_tensor(self, tensor: Any, attr: TensorAttr) -> bool:
        tensor = torch.as_tensor(tensor)
        key = self._key(attr)
        array = self._arrays.get(key)
        if array is None:
            if attr.index is not None:
                raise KeyError(f"FeatureStore: no tensor {key} to update rows of")
            if self._cache is None or self._storage is None:
                raise ValueError("FeatureStore: putting a new tensor needs the cache and storage given to the constructor")
            lba = self._storage.lba_size
            align = max(lba, self._cache.page_size)
            offset = (self._next_offset + align - 1) // align * align
            shape = tuple(tensor.shape) if tensor.dim() > 0 else (1,)
            array = bam.Array(self._cache, self._storage, shape, tensor.dtype, offset)
            self._next_offset = offset + tensor.numel() * tensor.element_size()
            self._arrays[key] = array
        ids = self._rows(array, attr.index)
        values = tensor.to(device=ids.device).reshape((ids.shape[0],) + array.shape[1:])
        row_bytes = array.row_width * array.element_size
        step = max(1, _PUT_CHUNK_BYTES // row_bytes)
        for start in range(0, ids.shape[0], step):
            array[ids[start:start + step]] = values[start:start + step]
        return True

    def _get_tensor(self, attr: TensorAttr) -> Optional[torch.Tensor]:
        array = self._arrays.get(self._key(attr))
        if array is None:
            return None
        return array[self._rows(array, attr.index)]

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        return self._arrays.pop(self._key(attr), None) is not None

    def _get_tensor_size(self, attr: TensorAttr) -> Optional[Tuple[int, ...]]:
        array = self._arrays.get(self._key(attr))
        return None if array is None else array.shape

    def get_all_tensor_attrs(self) -> List[TensorAttr]:
        return [TensorAttr(group_name=g, attr_name=a) for (g, a) in self._arrays]

    def flush(self) -> None:
        """Write back every array's dirty pages."""
        for cache in {id(a.cache): a.cache for a in self._arrays.values()}.values():
            cache.flush()
