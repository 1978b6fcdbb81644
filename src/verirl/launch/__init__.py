"""Starting the ranks of a data-parallel run: on this machine (or several) through torch's elastic
launcher, the API `torchrun` is built on."""
