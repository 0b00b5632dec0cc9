"""The Keras layer both Keras engines share (TensorFlow, never Horovod): the network, EfficientNet-Lite0, the tf.data
reader, the callbacks, the probe's measurement and the training flow itself. Each engine passes what differs (its
collectives, scope, optimizer wrapper and first callbacks) as a `keras.engine.KerasEngine`."""
