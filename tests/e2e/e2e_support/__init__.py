"""The end-to-end suite's pieces: the model, the servers, the test-only start-up module."""
