"""Textual dashboard of the coordinator server (tabs: Dashboard, Coordinator, Data server, Logs)."""
