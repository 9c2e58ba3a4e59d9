"""The Xylo SNN core (SynSense Xylo, syns61300 "v1" and syns61201 "v2").

* :mod:`~spikerec.hardware.export.xylo.arithmetic` - the integer rules of the core;
* :mod:`~spikerec.hardware.export.xylo.spec` - the chip's network specification and spikerec's
  integer simulator of it (bit-exact with ``xylosim``);
* :mod:`~spikerec.hardware.export.xylo.network` - a model quantised for Xylo (specification plus readout);
* :mod:`~spikerec.hardware.export.xylo.quantize` - quantise a CUBA-LIF stack to a specification;
* :mod:`~spikerec.hardware.export.xylo.xylosim_bridge` - run a specification in ``xylosim``.
"""
