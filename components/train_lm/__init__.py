"""Language model step: AWD-LSTM pretraining, written as the text trainer's LM assets."""
