"""Pure logic and wire formats shared by the server and the client.

Nothing in this package opens sockets or imports torch (the data providers' network
readers live in ``psyche_common.data`` and are only used by the processes that need them).
"""
