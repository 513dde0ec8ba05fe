"""Neural style transfer in the shape of the PyTorch tutorial and the repositories that follow it:
a pretrained-style feature network frozen first, loss modules inserted after chosen convolutions
(their targets computed by running the network on the style and content images while building),
and LBFGS optimizing the input image itself, clamped inside the closure. No module's parameters
are trained; the weights of the style and content terms are applied outside any module."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def gram(x):
    b, c, h, w = x.size()
    f = x.view(b * c, h * w)
    return f @ f.t() / (b * c * h * w)


class ContentLoss(nn.Module):
    def __init__(self, target):
        super().__init__()
        self.target = target.detach()

    def forward(self, x):
        self.loss = F.mse_loss(x, self.target)
        return x


class StyleLoss(nn.Module):
    def __init__(self, target_feature):
        super().__init__()
        self.target = gram(target_feature).detach()

    def forward(self, x):
        self.loss = F.mse_loss(gram(x), self.target)
        return x


def features():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AvgPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
    )


def build(cnn, style_img, content_img, content_at=("conv_2",), style_at=("conv_1", "conv_3")):
    model = nn.Sequential()
    content_losses, style_losses = [], []
    i = 0
    for layer in cnn.children():
        if isinstance(layer, nn.Conv2d):
            i += 1
            name = f"conv_{i}"
        elif isinstance(layer, nn.ReLU):
            name, layer = f"relu_{i}", nn.ReLU(inplace=False)
        else:
            name = f"pool_{i}"
        model.add_module(name, layer)
        if name in content_at:
            loss = ContentLoss(model(content_img))
            model.add_module(f"content_loss_{i}", loss)
            content_losses.append(loss)
        if name in style_at:
            loss = StyleLoss(model(style_img))
            model.add_module(f"style_loss_{i}", loss)
            style_losses.append(loss)
    return model, style_losses, content_losses


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--num-steps", type=int, default=3)
    parser.add_argument("--style-weight", type=float, default=1e6)
    parser.add_argument("--content-weight", type=float, default=1.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    cnn = features().eval()
    for p in cnn.parameters():
        p.requires_grad_(False)
    style_img = torch.rand(1, 3, args.size, args.size)
    content_img = torch.rand(1, 3, args.size, args.size)
    input_img = content_img.clone()

    model, style_losses, content_losses = build(cnn, style_img, content_img)
    input_img.requires_grad_(True)
    optimizer = torch.optim.LBFGS([input_img], max_iter=4)

    for step in range(args.num_steps):

        def closure():
            with torch.no_grad():
                input_img.clamp_(0, 1)
            optimizer.zero_grad()
            model(input_img)
            style_score = sum(sl.loss for sl in style_losses) * args.style_weight
            content_score = sum(cl.loss for cl in content_losses) * args.content_weight
            loss = style_score + content_score
            loss.backward()
            return loss

        loss = optimizer.step(closure)
        print(f"step {step}: loss {loss.item():.6f}")
    with torch.no_grad():
        input_img.clamp_(0, 1)
    print("image mean", input_img.mean().item())


if __name__ == "__main__":
    main()
