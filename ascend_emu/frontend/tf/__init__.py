"""The TensorFlow front end: Keras, SavedModel, GraphDef and tf.function models loaded into plain graphs,
the TensorFlow float32 reference run, the interceptions of ``emulate`` and the bundled seeded models.

With :mod:`ascend_emu.npu.aicpu`, the only code that imports TensorFlow.
"""
