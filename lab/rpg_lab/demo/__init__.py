"""The tiny task's two runs, applications on top of the launcher's harness: the CPU demo (``python -m rpg_lab.demo.cpu``,
docs/cpu-backend.md) and the GPU smoke run (``python -m rpg_lab.demo.gpu_smoke``, docs/gpu-smoke.md).
"""
