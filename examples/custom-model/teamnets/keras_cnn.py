"""A compact CNN in Keras: spec.model.builder "teamnets.keras_cnn:build".

The trainer calls build(input_shape, num_classes, **spec.model.params) and feeds float32 images in [0, 1]
(NHWC); the network returns logits. The trainer compiles it (loss from logits), scales the learning rate,
averages metrics over the ranks, stops early, checkpoints and resumes.
"""

import tensorflow as tf


def build(input_shape, num_classes, width=32, dropout=0.2):
    inputs = tf.keras.Input(shape=input_shape)
    x = inputs
    for depth in (width, 2 * width, 4 * width):
        x = tf.keras.layers.Conv2D(depth, 3, padding="same", activation="relu")(x)
        x = tf.keras.layers.MaxPooling2D()(x)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    x = tf.keras.layers.Dropout(dropout)(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(x), name="team_cnn")
