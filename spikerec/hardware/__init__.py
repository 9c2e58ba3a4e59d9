"""Deployment, the two jobs of trained models outside the training loop, one subpackage each:

* :mod:`~spikerec.hardware.export` - fixed-point export to neuromorphic targets (quantisation, the
  integer simulators, NIR, Xylo, Loihi 2) and the cross-check of the simulators;
* :mod:`~spikerec.hardware.online` - online (eligibility-trace) learning.

Submodules are imported on use, so ``import spikerec.hardware`` stays light.
"""
