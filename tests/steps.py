"""A training step as users write it, shared by tests (tests/ is on the path: pyproject's pythonpath)."""


def gradient_tape_step(tf, model, loss_fn, opt):
    """The custom-loop step of the TensorFlow guides: a ``tf.function`` computing the loss under a
    GradientTape and applying the gradients of ``model.trainable_variables`` with ``opt``; returns the loss."""
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return step
