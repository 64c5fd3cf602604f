"""What runs the model on one device (one tensor-parallel rank): the step input it reads, the
buffers it fills, the (compiled) forward, and how a runner is built from an EngineConfig.

The engine plans steps and the executors carry them to runners; nothing here imports either.
"""
