"""The centralized coordinator server: asyncio TCP, persistence, data server, dashboard."""
