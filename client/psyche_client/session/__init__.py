"""The client's session with the coordinator server: the connection (`server_link`),
reconnecting to it (`reconnect`) and the round pipeline's uplink across connections
(`uplink`). Imports neither the training code nor the round pipeline."""
