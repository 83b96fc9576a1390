"""Image datasets for classification (recipe resnet-cifar).

formats (CIFAR pickle and binary, IDX, ImageFolder readers) -> manifest (hashes recorded on first
read, verified after) -> loader (torch DataLoader driven by ``hpcpipe.data.order``); generator
writes small learnable datasets in every format for tests and offline demos.
"""
