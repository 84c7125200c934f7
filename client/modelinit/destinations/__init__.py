"""Where a file is written: every module that writes a checkpoint, local or in an object store.

- :mod:`~modelinit.destinations.choose`: which destination an ``out_dir`` names (the one place);
- :mod:`~modelinit.destinations.protocol`: the Destination protocol (prepare, write, finish,
  close), Survey, Finalized, and read_small_files (the small files handed to finish, from a
  stream the driver opens);
- :mod:`~modelinit.destinations.folder`: FolderWriter, a local folder one process writes;
- :mod:`~modelinit.destinations.prefix`: PrefixWriter, an object-store prefix (through
  :mod:`modelinit.bucket`) or the local folder that the ``--part K/N`` runs share;
- :mod:`~modelinit.destinations.local_prefix`: that shared folder behind the object store's interface;
- :mod:`~modelinit.destinations.local_io`, :mod:`~modelinit.destinations.direct_file`,
  :mod:`~modelinit.destinations.folder_lock`: a local file whole or not at all, O_DIRECT writes,
  one init per folder.

Nothing here imports :mod:`modelinit.sources`: what a source hands over is :mod:`modelinit.handoff`'s.
``choose.open_destination`` chooses one, the one place. Loaded only where something is
written (``import modelinit`` loads none of it).
"""
