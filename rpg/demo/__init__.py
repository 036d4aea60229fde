"""The tiny task's two runs, applications on top of the launcher's harness: the CPU demo (``python -m rpg.demo.cpu``,
docs/cpu-backend.md) and the GPU smoke run (``python -m rpg.demo.gpu_smoke``, docs/gpu-smoke.md).
"""
