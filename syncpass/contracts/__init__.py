"""The data every stage of the pass exchanges: op graph, costs, settings, hardware profiles."""
