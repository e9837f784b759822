"""Textual dashboard of one client (`psyche-client train --logs tui`): tabs Client,
Coordinator, Network and Logs, refreshed every 150 ms from a `ClientView` snapshot."""
