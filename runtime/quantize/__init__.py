"""Offline quantization (`radixlang quantize`): GPTQ, round-to-nearest and SmoothQuant W8A8, calibrated on
shipped text, written as HF folders the loader runs natively."""
