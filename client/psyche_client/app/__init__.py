"""The client process: its options (`options`, from the flag table `flags`), the parts it is
composed of (`parts`), the wiring (`app.ClientApp`) and the dashboard's view of it
(`snapshot`). Only the CLI and the dashboard import this package."""

from psyche_client.app.app import ClientApp, run_client
from psyche_client.app.options import ClientOptions, ServerOptions
from psyche_client.app.parts import Parts

__all__ = ["ClientApp", "ClientOptions", "Parts", "ServerOptions", "run_client"]
