"""The network lab's tests (the lab itself is `bench.harness.netlab`): `fixtures` holds the
`netlab` pytest fixture (skips with a reason where namespaces cannot be made).
"""
