"""The TensorFlow front end: models (Keras, SavedModel, GraphDef, tf.function) loaded into plain
graphs, their inputs, the TensorFlow float32 reference run, and the bundled seeded models.

With :mod:`ascend_emu.npu.aicpu`, the only code that imports TensorFlow.
"""
