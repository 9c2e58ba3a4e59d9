"""Analysis tools that reproduce the papers' studies on spikerec cells.

* :mod:`~spikerec.analysis.curse_of_memory`: closed forms and Monte Carlo of the curse of memory;
* :mod:`~spikerec.analysis.model_memory`: the same measurements on cells and stacks;
* :mod:`~spikerec.analysis.teacher_student`: the linear teacher-student task;
* :mod:`~spikerec.analysis.wcrnn`: weakly coupled residual RNNs (layer kind ``"wcrnn"``);
* :mod:`~spikerec.analysis.lyapunov`: Lyapunov spectra (QR method) and edge-of-chaos labels;
* :mod:`~spikerec.analysis.experiments`: sMNIST-lite and a small trainer;
* :mod:`~spikerec.analysis.plots`: PNG figures.

Submodules are imported on use (``from spikerec.analysis import curse_of_memory``).
"""
