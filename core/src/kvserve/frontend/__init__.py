"""The engine's frontend and its transports: ``AsyncLLM`` (tokenization, validation, the streams)
and the engine cores it drives, on a thread of this process or in a process of their own behind
ZeroMQ, both stepped by one loop (:mod:`kvserve.frontend.step_loop`). Sits above ``kvserve.engine``."""
