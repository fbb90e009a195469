"""The HF engines' compute kernels: ``fast`` (turngym's own few-kernel forward for Llama-family
decoders) and ``triton`` (its Triton kernels; ``triton_src`` holds their undecorated source)."""
