"""Deployment: fixed-point export to neuromorphic targets and online learning.

Submodules (imported on use, so ``import spikerec.hardware`` stays light):

* :mod:`~spikerec.hardware.profiles` - target arithmetic as data (``loihi2``, ``xylo``, ``xylo2``, ``generic``);
* :mod:`~spikerec.hardware.quantize` - per-layer quantisation, error report, STE fine-tuning;
  :mod:`~spikerec.hardware.qnetwork` - the quantised network it produces;
* :mod:`~spikerec.hardware.int_arith` - the integer arithmetic of the profiles for the one neuron step;
  :mod:`~spikerec.hardware.intsim` - integer simulator (and ``intsim_reference``, its plain-Python twin);
* :mod:`~spikerec.hardware.xylo` - the Xylo chip's core and specification (bit-exact with ``xylosim``);
* :mod:`~spikerec.hardware.nir_map` - one NIR mapping per neuron kind; :mod:`~spikerec.hardware.nir_io` -
  NIR export/import; :mod:`~spikerec.hardware.netx` - lava-dl netx HDF5;
* :mod:`~spikerec.hardware.export` - quantise, write and cross-check one model for one target;
* :mod:`~spikerec.hardware.crosscheck` - float vs snnTorch vs Norse vs integer simulator;
* :mod:`~spikerec.hardware.online` - online (eligibility-trace) learning.
"""
