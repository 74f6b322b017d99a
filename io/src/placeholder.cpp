namespace tally::io { int io_layer_linked() { return 1; } }
