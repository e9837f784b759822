"""The client's round pipeline: roles, consensus, witnessing and the runner that follows the
coordinator's run states."""
