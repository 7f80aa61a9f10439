"""OpenCL kernels and the Python that launches them, one family per module.

Kernels know nothing of autograd: each launcher takes ``pc.Tensor`` arguments, enqueues work
on the first input's queue and returns new tensors (or writes ``out=``) without waiting.
"""
