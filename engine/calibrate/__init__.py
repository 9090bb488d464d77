"""``shunter calibrate``: measure a device's copy bandwidths and a model's layer times,
and write them as a hardware profile the simulator and the remapping controller read.

``device`` times host-device copies, ``layers`` times one decoder layer's forward pass
by batch shape, ``profile`` writes and reads the JSON, ``run`` drives a calibration and
``cli`` is its command line.
"""
