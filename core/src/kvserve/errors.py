"""Exceptions that name what went wrong: the config field, the request field, the plugin and package."""


class KvserveError(Exception):
    """Base class of every error kvserve raises on purpose."""


class ConfigError(KvserveError, ValueError):
    """A configuration value is invalid; the message names the field."""


class PluginError(KvserveError):
    """A plugin could not be discovered, loaded or selected; the message names plugin and package."""


class UnknownComponentError(PluginError):
    """No component of that kind and name is registered (or none of that kind at all)."""


class CapacityError(KvserveError):
    """A request can never fit in the engine (prompt longer than max_model_len or the KV cache)."""


class EngineDeadError(KvserveError, RuntimeError):
    """The engine stopped (its batch failed, or it was shut down); every pending and later request gets this."""


class RequestError(KvserveError, RuntimeError):
    """One request failed inside the engine (its logits processor, its detokenization, ...) and was
    finished with ``finish_reason="abort"``; the other requests went on. ``output`` is its last output."""

    def __init__(self, message: str, output: object = None) -> None:
        super().__init__(message)
        self.output = output


class UnsatisfiableRequestError(KvserveError, ValueError):
    """A request's own parameters leave the engine nothing to do (its masks rule out every token, its
    grammar does not compile): the request is failed as a client error (HTTP 400 where nothing was sent)."""


class MissingExtraError(KvserveError, ImportError):
    """An optional dependency group of kvserve-core is not installed; the message says what to install."""


class WeightLoadError(KvserveError, ValueError):
    """A checkpoint tensor does not fit the model (no place for it, wrong shape, or missing);
    the message names the tensor."""


class WorkerError(KvserveError, RuntimeError):
    """A tensor-parallel worker process failed to start, failed in a step, or died (names the rank)."""
