"""Record data as the broker moves it: batches in memory and regions of files."""
