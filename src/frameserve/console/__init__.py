"""The web console served by ``serve`` (``/console``)."""
