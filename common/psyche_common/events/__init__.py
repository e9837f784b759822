"""A run's event files (`--events-dir`): what a client or the server did, one JSON object per
line, one file per epoch, the newest few kept (`files`); read back into one timeline of every
process that wrote under a directory (`timeline`) and described as text lines for
`psyche-server observe` (`render`)."""
