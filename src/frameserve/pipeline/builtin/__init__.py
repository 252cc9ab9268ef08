"""The built-in pipelines, each a :class:`~frameserve.pipeline.contract.Pipeline` subclass (see
:mod:`frameserve.pipeline.loader` for how names map to them)."""
