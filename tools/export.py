"""Export a trained model, post-processing included, to ONNX (onnxruntime) or a torch.export ExportedProgram.

    python tools/export.py --config rtdetr_convnext_toy --ckpt runs/.../last.ckpt --format onnx --out rtdetr.onnx
    python tools/export.py --config classification_toy --ckpt runs/.../last.ckpt --format exported_program --out cls.pt2

The inputs and outputs of each task: vision_tx/export.py.
"""

from vision_tx.export import main

if __name__ == "__main__":
    main()
