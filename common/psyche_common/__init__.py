"""What the server and the client share: pure logic, wire formats and the shared clients.

Pure (no sockets, no asyncio, no cryptography, no files): the coordinator state machine
(``coordinator``), the signed-commitment and announcement types (``announcements``), the
config models and rules (``config``, apart from its file loaders), ``shuffle``, ``bloom``,
``batch_id``, ``lr_schedule`` and the small value modules. Doing I/O: ``protocol`` (frames
over asyncio streams, the ed25519 handshake, the encrypted channel), ``data`` (the HTTP and
TCP data clients, memory-mapped token files), ``pacing``, ``atomic_file`` and ``logs``.
Nothing here imports torch.
"""
