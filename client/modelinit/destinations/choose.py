"""Which destination an ``out_dir`` names, chosen here and nowhere else: an object-store prefix, a
local folder, or the folder the ``--part K/N`` runs share. The writers' modules load inside the
functions, where something is written."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..bucket import is_bucket_url
from ..manifest import local_folder
from ..parts import Part

if TYPE_CHECKING:
    from ..bucket import Bucket
    from .local_prefix import LocalPrefix
    from .protocol import Destination


def open_destination(out_dir: str | os.PathLike, part: Part, *, fsync: bool = False, direct_io: bool = True,
                     hash_here: bool = True, field: str = "out_dir") -> Destination:
    """The destination ``out_dir`` names, chosen here and nowhere else: an object-store URL is a
    prefix (:class:`~modelinit.destinations.prefix.PrefixWriter` over a :class:`~modelinit.bucket.Bucket`);
    a local folder is written by the folder writer (:class:`~modelinit.destinations.folder.FolderWriter`), or,
    for a ``part`` of N, shared by the N runs through the prefix protocol on the folder
    (:class:`~modelinit.destinations.local_prefix.LocalPrefix`, written as the folder writer writes)."""
    if is_bucket_url(out_dir) or not part.whole:
        from .prefix import PrefixWriter  # the writers load where something is written (a fast CLI start)

        return PrefixWriter(open_prefix(out_dir, field, fsync=fsync, direct_io=direct_io), hash_here)
    from .folder import FolderWriter

    return FolderWriter(local_folder(out_dir, field), fsync=fsync, direct_io=direct_io, hash_here=hash_here)


def open_prefix(url: str | os.PathLike, field: str, *, fsync: bool = False, direct_io: bool = True) -> "Bucket | LocalPrefix":
    """An object-store URL as a :class:`~modelinit.bucket.Bucket`; a local folder (a path or a
    ``file://`` URL) as a :class:`~modelinit.destinations.local_prefix.LocalPrefix`."""
    from ..bucket import Bucket
    from .local_prefix import LocalPrefix

    if is_bucket_url(url):
        return Bucket(os.fspath(url), field)
    return LocalPrefix(local_folder(url, field), field, direct_io=direct_io, fsync=fsync)
