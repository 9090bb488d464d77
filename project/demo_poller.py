"""The demo's node poller: a thread that keeps the demo node's status and memory map live
while the demo serves."""

from __future__ import annotations

import threading

from shunter.project.demo_children import CHILD_STOP_S

POLL_INTERVAL_S = 2.0


class NodePoller(threading.Thread):
    """Calls ``node_poll`` on a node every ``interval_s`` until ``stop``: beat's job
    (``nodes_poll``), done in-process because the embedded default runs no beat. A poll
    that fails is logged and retried at the next tick."""

    def __init__(self, node_id: int, interval_s: float = POLL_INTERVAL_S) -> None:
        super().__init__(name="shunter-demo-node-poll", daemon=True)
        self.node_id, self.interval_s = node_id, interval_s
        self._stopped = threading.Event()

    def run(self) -> None:
        import logging

        from django.db import close_old_connections, connection

        from shunter.platform import services
        from shunter.platform.models import Node

        log = logging.getLogger("shunter.project.demo")
        try:
            while not self._stopped.wait(self.interval_s):
                try:
                    node = Node.objects.filter(pk=self.node_id).first()
                    if node is not None:
                        services.node_poll(node=node)
                except Exception:  # a locked database, a restarting engine: try again
                    log.exception("demo node poll failed")
                finally:
                    close_old_connections()
        finally:
            connection.close()

    def stop(self) -> None:
        self._stopped.set()
        if self.is_alive():
            self.join(timeout=CHILD_STOP_S)
