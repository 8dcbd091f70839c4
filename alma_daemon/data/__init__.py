"""Data: the datasets (MNIST, CIFAR-10, text corpora, a user's arrays) read from a local folder, their
seeded split into mega-batches, drift, tensors, and the wire codec that turns chunks into Kafka
records and back (docs/wire-format.md).
"""
