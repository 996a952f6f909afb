"""The data side: reading a data root into a catalog, the data contracts, and splitting."""
