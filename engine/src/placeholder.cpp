namespace tally::engine { int engine_layer_linked() { return 1; } }
