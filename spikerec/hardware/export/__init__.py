"""Fixed-point export of a trained model to a neuromorphic target.

Submodules (imported on use, so ``import spikerec.hardware.export`` stays light):

* :mod:`~spikerec.hardware.export.profiles` - target arithmetic as data (``loihi2``, ``xylo``, ``xylo2``, ``generic``);
* :mod:`~spikerec.hardware.export.quantize` - per-layer quantisation, error report, STE fine-tuning;
  :mod:`~spikerec.hardware.export.quantized_network` - the quantised network it produces;
* :mod:`~spikerec.hardware.export.profile_arithmetic` - the integer arithmetic of the profiles for the one
  neuron step; :mod:`~spikerec.hardware.export.intsim` - the integer simulator;
* :mod:`~spikerec.hardware.export.xylo` - the Xylo chip: its arithmetic, specification, quantiser and the
  bridge to SynSense's ``xylosim``;
* :mod:`~spikerec.hardware.export.nir_map` - one NIR mapping per neuron kind;
  :mod:`~spikerec.hardware.export.nir_io` - NIR export/import;
* :mod:`~spikerec.hardware.export.loihi2_netx` - lava-dl netx HDF5 for Loihi 2;
* :mod:`~spikerec.hardware.export.crosscheck` - float vs snnTorch vs Norse vs integer simulator;
* :mod:`~spikerec.hardware.export.pipeline` - quantise, write and cross-check one model for one target.
"""
