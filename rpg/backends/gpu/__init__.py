"""GPU backend: verl's own CUDA path (vLLM rollouts, FSDP actors); its interface is ``backend``. Importing this
package does nothing.
"""
