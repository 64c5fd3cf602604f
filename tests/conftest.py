import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("KVSERVE_LOG_LEVEL", "WARNING")
