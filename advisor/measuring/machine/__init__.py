"""The machine a cell runs on: what it is (hardware), what it does meanwhile (monitor), its helper processes."""
