"""The front ends: one subpackage per framework, each loading its models into the same plain graphs and
running its own float32 reference; nothing below this layer learns which framework a graph came from.

- :mod:`.tf`: TensorFlow (Keras, SavedModel, GraphDef, tf.function, TF1 sessions);
- :mod:`.onnx`: ONNX (the ATC path), onnxruntime as reference;
- :mod:`.shapes`, :mod:`.inputs`: what every front end shares (input shapes, the inputs of a run).
"""
