"""The seeds' convnet-benchmarks networks and ResNet-50 as kiln.layers networks (channels-last).

    import convnets
    net = convnets.build("alexnet", dtype=kiln.float16)          # N = 128 unless given
    print(net.out_shape, net.flops / 1e9, "GFLOP per fprop")

AlexNet (the convnet-benchmarks variant: 64-192-384-256-256 filters) and Overfeat (fast) at
N=128, VGG-A at N=64 and ResNet-50 (v1.5: the stride on the 3x3 convolution) at N=256, as
convnet-benchmarks times them; every convolution is followed by ReLU (fused into it), ResNet's
by batch norm. Nothing is allocated until a layer first runs.
"""
import kiln
from kiln.layers import FC, LRN, BatchNorm, Conv, Network, Pool, ReLU, Residual


def alexnet():
    return (128, 224, [Conv(64, 11, pad=2, stride=4, relu=True), Pool("max", 3, 2),
                       Conv(192, 5, pad=2, relu=True), Pool("max", 3, 2),
                       Conv(384, 3, pad=1, relu=True), Conv(256, 3, pad=1, relu=True), Conv(256, 3, pad=1, relu=True),
                       Pool("max", 3, 2), FC(4096, relu=True), FC(4096, relu=True), FC(1000)])


def alexnet_lrn():
    """The original AlexNet's LRN after its first two convolutions (not timed by convnet-benchmarks)."""
    n, hw, layers = alexnet()
    return n, hw, layers[:1] + [LRN(5)] + layers[1:3] + [LRN(5)] + layers[3:]


def overfeat():
    return (128, 231, [Conv(96, 11, stride=4, relu=True), Pool("max", 2),
                       Conv(256, 5, relu=True), Pool("max", 2),
                       Conv(512, 3, pad=1, relu=True), Conv(1024, 3, pad=1, relu=True), Conv(1024, 3, pad=1, relu=True),
                       Pool("max", 2), FC(3072, relu=True), FC(4096, relu=True), FC(1000)])


def vgg_a():
    c = lambda k: Conv(k, 3, pad=1, relu=True)
    return (64, 224, [c(64), Pool("max", 2), c(128), Pool("max", 2), c(256), c(256), Pool("max", 2),
                      c(512), c(512), Pool("max", 2), c(512), c(512), Pool("max", 2),
                      FC(4096, relu=True), FC(4096, relu=True), FC(1000)])


def _bottleneck(width, out, stride, project):
    branch = [Conv(width, 1, bias=False), BatchNorm(relu=True),
              Conv(width, 3, pad=1, stride=stride, bias=False), BatchNorm(relu=True),
              Conv(out, 1, bias=False), BatchNorm()]
    shortcut = [Conv(out, 1, stride=stride, bias=False), BatchNorm()] if project else []
    return Residual(branch, shortcut)


def resnet50():
    layers = [Conv(64, 7, pad=3, stride=2, bias=False), BatchNorm(relu=True), Pool("max", 3, 2, pad=1)]
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(_bottleneck(width, 4 * width, stride if b == 0 else 1, b == 0))
    # The global average pool over the 7 x 7 map, then the classifier.
    layers += [Pool("avg", 7), FC(1000)]
    return 256, 224, layers


NETWORKS = {"alexnet": alexnet, "alexnet_lrn": alexnet_lrn, "overfeat": overfeat, "vgg_a": vgg_a,
            "resnet50": resnet50}


def build(name, dtype=kiln.float16, ctx=None, N=None, seed=0, conv_sums=False):
    """The network `name` (NETWORKS) for N images (default: the benchmark's) of 3 channels;
    conv_sums: each batch norm's sums from the convolution before it (Network's)."""
    n, hw, layers = NETWORKS[name]()
    return Network(layers, (N or n, hw, hw, 3), dtype=dtype, ctx=ctx, seed=seed, conv_sums=conv_sums)


if __name__ == "__main__":
    for name in NETWORKS:
        net = build(name, ctx=kiln.Context("cpu"))
        print(f"{name:<12} input {net.layers[0].in_shape} -> {net.out_shape}, "
              f"{net.flops / 1e9 / net.out_shape[0]:.2f} GFLOP per image (fprop)")
